"""The Lua core: one operation per ``NAME-K.lua`` file (K = number of KEYS);
``loader`` loads and calls them (includes, SHA, EVALSHA then EVAL), ``calls``
has one typed function per script: the only place that builds KEYS/ARGV."""
