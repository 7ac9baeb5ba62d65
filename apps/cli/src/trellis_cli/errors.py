"""The ``trellis`` exit codes, and the one place where failures become them.

Scripts and CI act on the exit code, so each code means one thing:

- ``0`` (:data:`OK`): done, or the answer is yes.
- ``1`` (:data:`NEGATIVE`): the mesh answered, and the answer is no: a policy check denied,
  a service unhealthy, a document invalid, or the proxy, workload or certificate named does
  not exist (HTTP 404/409 from a service).
- ``2`` (:data:`ERROR`): the command could not be carried out, so there is no answer: a usage
  error (click's own, or a request a service refused as malformed, HTTP 400/422), no admin
  token or one the service refused (401/403), the mesh not running or a service unreachable,
  timing out or failing (HTTP 5xx), Envoy not installed, ``trellis up`` unable to start.

Commands report a negative answer with ``raise SystemExit(NEGATIVE)`` after printing it, or
raise :class:`NotFound`; they raise :class:`CliError` for everything of exit 2.
:class:`TrellisGroup` turns any other exception that escapes a command into a one-line exit 2
(an ``OSError``, an HTTP error), so nothing a script reads as "no" is really a crash; an
exception nobody expected is a bug and keeps its traceback, still with exit 2.
"""

from __future__ import annotations

import sys
import traceback
from typing import TYPE_CHECKING, Any

import click

from trellis_common.envoybin import EnvoyNotFound

if TYPE_CHECKING:
    import httpx

OK = 0
NEGATIVE = 1
ERROR = 2
INTERRUPTED = 130  # the shell's code for Ctrl-C

EPILOG = """\b
Exit codes:
  0  success (the answer is yes)
  1  a negative answer: policy denied, a service unhealthy, a document
     invalid, or the proxy, workload or certificate named not found
  2  no answer: a usage error (bad option, or a request a service
     refused as malformed), no admin token or a refused one, the mesh
     not running or a service unreachable, timing out or failing
     (HTTP 5xx), Envoy not installed, or `trellis up` unable to start
"""


class CliError(click.ClickException):
    """The command could not be carried out; shown as one line, exit 2."""

    exit_code = ERROR


class NotFound(click.ClickException):
    """What the command names does not exist: a negative answer, exit 1."""

    exit_code = NEGATIVE


def unreachable(service: str, url: str, exc: httpx.TransportError, state_dir: object) -> CliError:
    import httpx  # loaded already: the caller caught its error

    reason = "timed out" if isinstance(exc, httpx.TimeoutException) else "not reachable"
    return CliError(
        f"{service} is {reason} at {url} ({exc.__class__.__name__}); is the mesh running? "
        f"Start it with `trellis up` (`make run`), or point --state-dir or TRELLIS_STATE_DIR "
        f"at its state directory (now {state_dir})"
    )


def for_status(
    service: str, status: int, detail: str, token_sent: bool = False
) -> click.ClickException:
    """The error for an HTTP error answer: 404/409 are answers (1), anything else is not (2).
    ``token_sent``: the request carried an onboarding or heartbeat token, not the admin's."""
    if status in (404, 409):
        return NotFound(f"{service} answered {status}: {detail}")
    if status in (401, 403) and token_sent:
        return CliError(f"{service} answered {status}: {detail}")
    if status in (401, 403):
        return CliError(
            f"{service} answered {status}: {detail} (the admin token was refused: check "
            "TRELLIS_ADMIN_TOKEN, or --state-dir pointing at the mesh that wrote admin-token)"
        )
    if status >= 500:
        return CliError(f"{service} failed to answer ({status}): {detail}")
    return CliError(f"{service} refused the request ({status}): {detail}")


class TrellisGroup(click.Group):
    """A click group whose commands end with exit 0, 1 or 2 and nothing else."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, SystemExit):
            raise
        except (KeyboardInterrupt, click.Abort):
            raise click.exceptions.Exit(INTERRUPTED) from None
        except Exception as exc:
            raise as_cli_error(exc) from exc


def as_cli_error(exc: Exception) -> CliError:
    """The exit-2 error for an exception that escaped a command."""
    if isinstance(exc, EnvoyNotFound | OSError):
        return CliError(str(exc))
    # httpx is imported by the commands that talk HTTP, not by `trellis --help`: an httpx
    # error can only come from a command that loaded it
    httpx = sys.modules.get("httpx")
    if httpx is not None and isinstance(exc, httpx.HTTPError):
        return CliError(f"HTTP request failed: {exc} ({exc.__class__.__name__})")
    traceback.print_exc()
    return CliError(
        f"unexpected {exc.__class__.__name__} (a bug in trellis; the traceback is above)"
    )
