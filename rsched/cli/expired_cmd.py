"""`rsched run expired`: parse, check the options (rsched.expired.options), then hand
over to rsched.expired.runner."""

from __future__ import annotations

import click

from rsched.cli.main import App, pass_app
from rsched.core.errors import BadInput, ExitCode


@click.command("expired")
@click.option(
    "--pattern",
    metavar="GLOB",
    help="Key names to fire for, a Redis glob (* ? [abc] [^a] \\x), like 'order:timeout:*'.",
)
@click.option(
    "--handler",
    metavar="CMD",
    help="Command to run per expired key (or give it after --). Split like a shell would, "
    "never run by one; the key's name is appended and in RSCHED_KEY.",
)
@click.option(
    "--db",
    metavar="N",
    help="Database whose expiries to watch [default: the one in --redis-url]. The claim and "
    "sweep keys live there too. Redis Cluster: 0 only.",
)
@click.option(
    "--backup-sweep",
    is_flag=True,
    help="Also fire keys armed with rsched.expired.arm() whose expiry event never came "
    "(subscriber down, disconnected, Redis late to expire them).",
)
@click.option("--concurrency", metavar="N", help="Handlers running at once [default 1].")
@click.option("--timeout", metavar="DUR", help="Kill a handler's process group after DUR.")
@click.option(
    "--claim-window",
    metavar="DUR",
    help="Lifetime of the claim that makes one subscriber fire a key that was not armed; "
    "a second expiry of that key within it is taken for a duplicate [default 10s].",
)
@click.option(
    "--set-notify",
    is_flag=True,
    help="Turn on expiry events when they are off: CHANGES THE SERVER'S CONFIG "
    "(CONFIG SET notify-keyspace-events, merged with the flags already set; not persisted).",
)
@click.argument("command", nargs=-1, required=False, metavar="-- CMD...")
@pass_app
def expired(
    app: App,
    pattern: str | None,
    handler: str | None,
    db: str | None,
    backup_sweep: bool,
    concurrency: str | None,
    timeout: str | None,
    claim_window: str | None,
    set_notify: bool,
    command: tuple[str, ...],
) -> None:
    """Run a command when a key matching a pattern expires (Redis keyspace
    notifications), once across every subscriber of the same pattern.

    \b
      rsched run expired --pattern 'order:timeout:*' -- ./close-order
      rsched run expired --pattern 'order:timeout:*' --backup-sweep --handler ./close-order

    \b
    The sorted-set queue (rsched add --in 30m + rsched run consumer) is the
    reliable way to run something later. Keyspace events are fire-and-forget:
    an expiry while no subscriber is connected is lost, Redis publishes it
    when it actually deletes the key (on access or by its background cycle:
    usually within ~100ms, possibly later), and a handler that fails or whose
    subscriber dies after the claim is not run again.

    The server must publish expiry events: notify-keyspace-events must contain
    E and x (CONFIG SET notify-keyspace-events Ex); otherwise this exits 78
    (--set-notify sets it). Each expiry is claimed in Redis before its handler
    runs, so several subscribers run it once; a key that was not armed is
    claimed for --claim-window. The claim is per key in the namespace:
    subscribers with overlapping patterns share keys (give different handlers
    of the same keys different --namespace values).

    --backup-sweep: keys set with the library call rsched.expired.arm(rs, key,
    ttl_ms, value=...) (the key with PX plus a sorted-set entry, in one Lua
    call) are also fired when their key is gone but no event was handled; each
    arming fires once, by the event or by the sweep. Cancel them with
    rsched.expired.disarm(), not DEL.

    Redis Cluster: expiry events are published by the node that expires the
    key, so this subscribes on every primary and follows the list of primaries
    (checked every 5s and after a connection error: a promoted replica is
    subscribed to, with its notify-keyspace-events checked or set). The claim
    and sweep keys live in each trigger key's slot; each node's sweep finds
    the armed sets of its slots by SCAN (on start, after each reconnection,
    every 60s) and from the events it sees. Database 0 only.

    The handler gets the key's name as its last argument and in RSCHED_KEY,
    plus RSCHED_PATTERN, RSCHED_DB, RSCHED_FIRED_BY (event|sweep),
    RSCHED_FIRED_AT and, for armed keys, RSCHED_EXPIRE_AT and arm()'s value on
    stdin. SIGTERM/SIGINT stop listening and give running handlers 30s (a
    second signal stops at once); exit 0 after SIGTERM, 130 after SIGINT.
    """
    from rsched.expired.options import expired_options
    from rsched.expired.runner import ExpiredRunner

    if not pattern:
        raise BadInput("--pattern", "is required, like --pattern 'order:timeout:*'")
    if handler and command:
        raise BadInput("--handler", "give the command once: either --handler CMD or -- CMD")
    if not handler and not command:
        raise BadInput(
            "--handler",
            "give the command to run, like --handler ./close-order or -- ./close-order",
        )
    opts = expired_options(
        pattern,
        handler if handler else list(command),
        db=db,
        backup_sweep=backup_sweep,
        concurrency=1 if concurrency is None else concurrency,
        timeout_ms=timeout,
        claim_window_ms=claim_window,
        set_notify=set_notify,
        on_path=True,
    )
    # Everything is checked; only now touch Redis.
    runner = ExpiredRunner(app.rs, options=opts, verbose=app.verbose, quiet=app.quiet, log=app.log)
    runner.run()
    if runner.interrupted:  # Ctrl-C: 130, as the exit-code table says (SIGTERM: 0)
        raise SystemExit(int(ExitCode.INTERRUPTED))
