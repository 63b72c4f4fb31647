"""The JSON endpoints: each reads through the control layer and answers what the CLI's `--json` prints
for the same job (docs/architecture.md, "Frontends"). None of them ever touches the job's environment."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

from jobwarden import __version__, config
from jobwarden.clock import SystemClock, iso
from jobwarden.control.prometheus import home_exposition
from jobwarden.control.views.metrics import run_samples
from jobwarden.joboptions import JobOptions
from jobwarden.model import ACTIVE_STATES
from jobwarden.web.app import App
from jobwarden.web.messages import (
    API_HEADERS,
    HTTPProblem,
    Request,
    Response,
    json_response,
    text_response,
)

STACK_DUMPS_SHOWN = 3  # the job page shows the last dumps; older ones stay in the store
MAX_WALL_TIME = 1e11  # seconds since 1970: year 5138, past any `since` a page sends
MAX_POINTS = 100_000  # a chart draws a few hundred


def healthz(app: App, req: Request) -> Response:
    """A probe's question, with no token and for any Host (a kubelet names the pod by its IP): is the
    newest job of this home running and not hung, or succeeded? `ok` 200, else `hung` or `failed` 503,
    the same judgement as `jobwarden health` (control.health); nothing else is said."""
    from jobwarden.control.health import health

    status, word = health(app.home, procfs=app.procfs).http
    return text_response(word + "\n", status)


def server(app: App, req: Request) -> Response:
    """What the pages need to know of this server: its version, and whether it changes nothing."""
    return json_response({"version": __version__, "read_only": app.read_only})


LIST_PAGE_MAX = 1000  # jobs in one page of the list


def jobs(app: App, req: Request) -> Response:
    """`ps --all --json`, plus what the list page shows beside it (GPUs, why a queued job waits). With any
    of `limit`, `offset`, `state`, `name`: one page of the list as the list page shows it, newest first,
    of the jobs in `state` (all, active: not over, hung: running with a current hang finding, or a state)
    whose name contains `name` or whose id it is; the number of jobs that match in X-Total-Count and each
    state's count over all jobs in X-State-Counts (JSON). A page of 100 out of 10,000 jobs is 70 KB where
    the whole list is 6.6 MB: the page asks every 5 s."""
    from jobwarden.control.views.joblist import list_page, views_of

    paged = any(req.param(k) is not None for k in ("limit", "offset", "state", "name"))
    limit = req.int_param("limit", minimum=1, maximum=LIST_PAGE_MAX) or (LIST_PAGE_MAX if paged else None)
    offset = req.int_param("offset") or 0
    state, name = req.param("state") or "all", (req.param("name") or "").strip().lower()
    if paged:
        states = _LIST_STATES.get(state, frozenset({state}))
        page = list_page(app.home, app.procfs, states, name, offset, limit or 0)
        views = page.views
    else:
        views = views_of(app.home, app.procfs, include_ended=True, metrics=True)
    response = json_response(
        [
            {**v.summary_json(), "gpu_ids": list(v.run.gpu_ids), "queued_reason": v.run.queued_reason}
            for v in views
        ]
    )
    if paged:
        response.headers["X-Total-Count"] = str(page.matching)
        response.headers["X-State-Counts"] = json.dumps(page.state_counts, separators=(",", ":"))
    return response


# the list page's state filter as `ps --state` words: all, active (a shim watches it), or one state
_LIST_STATES: dict[str, frozenset[str] | None] = {
    "all": None,
    "active": frozenset(str(s) for s in ACTIVE_STATES),
}


def _status(app: App, req: Request, ref: str) -> Any:
    from jobwarden.control.views.jobstatus import status_of

    return status_of(app.home, app.procfs, ref, req.int_param("run", minimum=1))


def status(app: App, req: Request, ref: str) -> Response:
    """`status --json`, plus what the job page shows of how the job was started: its options and the
    *names* of its `--env` keys (never a value: they may be tokens)."""
    found = _status(app, req, ref)
    return json_response(
        {**found.to_json(), "options": shown_options(found.job.options), "env_keys": sorted(found.job.env)}
    )


def shown_options(options: JobOptions) -> dict[str, Any]:
    """The job's options as the page lists them: those set, a --notify URL by its host alone (a
    webhook's path is its secret)."""
    shown = {k: v for k, v in options.to_json().items() if v not in (None, [], ())}
    if options.notify:
        host = urlsplit(options.notify).hostname
        shown["notify"] = f"{urlsplit(options.notify).scheme}://{host}/…" if host else "set"
    shown.pop("web_url", None)
    return shown


def explain(app: App, req: Request, ref: str) -> Response:
    """`explain --json`, with the newest profile's summary as the CLI gives it, and a failure's root
    cause citing what changed since its command last succeeded."""
    from jobwarden.control.changes import explained
    from jobwarden.control.profile import newest_summary

    status = explained(app.home, app.procfs, ref, req.int_param("run", minimum=1))
    profiled = newest_summary(app.home, status.job.id, status.run.n)
    return json_response({**status.explain_json(), "profile": profiled})


def changes(app: App, req: Request, ref: str) -> Response:
    """`diff --json` of the run (`?run=N`, default its last) against the last success of its command.
    Nothing to compare with (no success before it, a run without a fingerprint) is no error: `b` and
    `changes` are null and `reason` says why, as the job page shows it."""
    from jobwarden.control.changes import NothingToCompare, diff_runs
    from jobwarden.control.jobs import find_run

    run_n = req.int_param("run", minimum=1)
    try:
        return json_response(diff_runs(app.home, ref, run_n=run_n).to_json())
    except NothingToCompare as err:
        job, run = find_run(app.home, ref, run_n)
        a = {"id": job.id, "run": run.n}
        return json_response({"a": a, "b": None, "changes": None, "reason": err.message})


def samples(app: App, req: Request, ref: str) -> Response:
    """`metrics --json`: the run's samples, oldest first."""
    since = req.float_param("since", minimum=0, maximum=MAX_WALL_TIME)
    points = req.int_param("points", minimum=2, maximum=MAX_POINTS)
    found = run_samples(app.home, ref, req.int_param("run", minimum=1), since=since, points=points)
    return json_response([s.to_json() for s in found.samples])


def stacks(app: App, req: Request, ref: str) -> Response:
    """The last stack dumps stored for the run (by `dump` or the hang watchdog), newest last, each with
    the lines `jobwarden dump` prints for it."""
    from jobwarden.control.dump import stored_stacks
    from jobwarden.text.render import process_stack_lines

    _, _, dumps = stored_stacks(app.home, ref, req.int_param("run", minimum=1), STACK_DUMPS_SHOWN)
    return json_response(
        [
            {
                "at": iso(d.at),
                "trigger": d.trigger,
                "processes": [s.to_json() for s in d.stacks],
                "text": [line for s in d.stacks for line in (*process_stack_lines(s), "")],
            }
            for d in dumps
        ]
    )


def profile(app: App, req: Request, ref: str) -> Response:
    """The run's newest profile (`jobwarden profile`, or the one taken on a speed finding): its summary
    as `profile --json` prints it, or with ?format=speedscope the samples as stored (speedscope.app opens
    them). A run without one: the summary is null (the job page asks every few seconds; none yet is no
    error), the samples 404."""
    from jobwarden.control.jobs import find_run
    from jobwarden.control.profile import newest_speedscope, newest_summary

    wanted = req.param("format") or "summary"
    if wanted not in ("summary", "speedscope"):
        raise HTTPProblem(400, f"format: {wanted!r} is neither summary nor speedscope")
    job, run = find_run(app.home, ref, req.int_param("run", minimum=1))
    found = (newest_speedscope if wanted == "speedscope" else newest_summary)(app.home, job.id, run.n)
    if found is None and wanted == "summary":
        return json_response(None)
    if found is None:
        raise HTTPProblem(
            404, f"job {job.id} run {run.n} has no profile", f"take one: jobwarden profile {job.id}"
        )
    if isinstance(found, bytes):
        return Response(200, found, "application/json", dict(API_HEADERS))
    return json_response(found)


def stop(app: App, req: Request, ref: str) -> Response:
    """`stop --json`. Blocks this request's thread until the job has ended (the grace period at most)."""
    from jobwarden.control.lifecycle import stop as stop_job

    grace = _body(req).get("grace")
    grace_s = config.parse_duration(str(grace), "grace") if grace is not None else None
    return json_response(stop_job(app.home, app.procfs, ref, grace_s).to_json())


def rerun(app: App, req: Request, ref: str) -> Response:
    """`rerun --json`: the same command, cwd, `--env` values and options as a new job (control.rerun,
    the code `jobwarden rerun` runs)."""
    from jobwarden.control.rerun import rerun as rerun_job

    launched, old = rerun_job(app.home, ref)
    return json_response({**launched.to_json(), "rerun_of": old.id})


def dump(app: App, req: Request, ref: str) -> Response:
    """`dump --json`: the stacks taken now (stored too), or for an ended job the last stored."""
    from jobwarden.control.dump import dump_job

    native = _body(req).get("native", True) is not False
    return json_response(dump_job(app.home, app.procfs, ref, native=native).to_json())


def _body(req: Request) -> dict[str, Any]:
    if not req.body.strip():
        return {}
    try:
        body = json.loads(req.body)
    except (ValueError, UnicodeDecodeError):
        raise HTTPProblem(400, "the request body is not JSON") from None
    except RecursionError:  # `[[[[...]]]]` 60,000 deep: the parser's recursion, not the server, gives up
        raise HTTPProblem(400, "the request body is JSON nested too deeply") from None
    if not isinstance(body, dict):
        raise HTTPProblem(400, "the request body must be a JSON object")
    return body


def metrics(app: App, req: Request) -> Response:
    """Prometheus text exposition of every job."""
    text = home_exposition(app.home, app.procfs, SystemClock().wall())
    return text_response(text, content_type="text/plain; version=0.0.4")
