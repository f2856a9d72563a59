"""No domain knowledge: defaults, errors (and the one Redis-error translation),
validation, time, cron expressions, config, keys, connections, the lean RESP
client, replication waits. Imports nothing above itself."""
