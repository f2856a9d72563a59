"""``rsched web``: the web console (``pip install 'rsched[web]'``).

Server-rendered pages (Starlette + Jinja2, autoescaped) over the same library
calls and the same JSON objects as the CLI (:mod:`rsched.tools.actions`,
the domain's ``to_json``); one small vendored script (``static/console.js``)
refreshes the live parts of a page by short polling. Who may see and do what:
:mod:`rsched.web.security`. What the pages read: :mod:`rsched.web.console`.

Sits above the tools: imports the facade, the tools and the engine, never the CLI.
"""

from __future__ import annotations

from rsched.core.errors import ConfigError

INSTALL_HINT = (
    "rsched web needs the web extra: pip install 'rsched[web]' (starlette, uvicorn, jinja2)"
)


def require() -> None:
    """ConfigError (exit 78) naming the extra when its packages are missing."""
    try:
        import jinja2  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise ConfigError(INSTALL_HINT) from None
