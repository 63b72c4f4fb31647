"""The versioned schema. Each migration runs in one transaction and bumps PRAGMA user_version.

Never edit a released migration: append a new one. tests/fixtures holds databases written by older
versions, and they must keep opening.
"""

from __future__ import annotations

MIGRATIONS: list[str] = [
    # 1: jobs, their runs (attempts) and an append-only event log
    """
    CREATE TABLE jobs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        name TEXT NOT NULL,
        command TEXT NOT NULL,            -- JSON list of argv
        cwd TEXT NOT NULL,
        env TEXT NOT NULL DEFAULT '{}',   -- JSON of --env only; never printed (tokens)
        options TEXT NOT NULL DEFAULT '{}',
        created_at REAL NOT NULL
    );
    CREATE INDEX jobs_by_name ON jobs(name);
    CREATE TABLE runs (
        job_id INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
        n INTEGER NOT NULL,
        state TEXT NOT NULL,
        shim_pid INTEGER, shim_start INTEGER,
        pid INTEGER, pid_start INTEGER,
        started_at REAL, ended_at REAL,
        exit_code INTEGER, signal TEXT, wait_status INTEGER,
        end_reason TEXT, error TEXT,
        PRIMARY KEY (job_id, n)
    );
    CREATE TABLE events (
        id INTEGER PRIMARY KEY,
        job_id INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
        run INTEGER,
        at REAL NOT NULL,
        kind TEXT NOT NULL,
        data TEXT NOT NULL DEFAULT '{}'
    );
    CREATE INDEX events_by_run ON events(job_id, run);
    """,
    # 2: containment and stop bookkeeping, the process tree, metrics samples, findings
    """
    ALTER TABLE runs ADD COLUMN stop_requested_at REAL;
    ALTER TABLE runs ADD COLUMN stop_grace REAL;
    ALTER TABLE runs ADD COLUMN containment TEXT;
    ALTER TABLE runs ADD COLUMN orphans_left TEXT;   -- JSON list, descendants alive when main ended
    ALTER TABLE runs ADD COLUMN survivors TEXT;      -- JSON list, processes that could not be ended
    CREATE TABLE processes (
        job_id INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
        run INTEGER NOT NULL,
        pid INTEGER NOT NULL,
        start_time INTEGER NOT NULL,
        ppid INTEGER,
        cmdline TEXT,
        state TEXT,
        rss_bytes INTEGER,
        cpu_percent REAL,
        first_seen REAL NOT NULL,
        ended_at REAL,
        wait_status INTEGER,
        PRIMARY KEY (job_id, run, pid, start_time)
    );
    CREATE TABLE samples (
        job_id INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
        run INTEGER NOT NULL,
        at REAL NOT NULL,
        nprocs INTEGER NOT NULL,
        cpu_percent REAL NOT NULL,
        rss_bytes INTEGER NOT NULL
    );
    CREATE INDEX samples_by_run ON samples(job_id, run, at);
    CREATE TABLE findings (
        job_id INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
        run INTEGER NOT NULL,
        at REAL NOT NULL,
        rule TEXT NOT NULL,
        body TEXT NOT NULL
    );
    """,
    # 3: diagnosis and resources: stack dumps, GPU claims, what a queued run waits for, richer samples
    """
    ALTER TABLE runs ADD COLUMN queued_reason TEXT;  -- why a queued run has not started (GPUs busy, ...)
    ALTER TABLE runs ADD COLUMN gpu_ids TEXT;        -- JSON list of the GPU indexes the run holds
    ALTER TABLE runs ADD COLUMN mem_peak_bytes INTEGER;
    ALTER TABLE processes ADD COLUMN gpu_memory_bytes INTEGER;
    ALTER TABLE samples ADD COLUMN cpu_time_s REAL;  -- cumulative CPU seconds of the tree's live members
    ALTER TABLE samples ADD COLUMN io_bytes INTEGER;
    ALTER TABLE samples ADD COLUMN gpu_memory_bytes INTEGER;
    ALTER TABLE samples ADD COLUMN gpu_util REAL;
    CREATE TABLE stacks (
        id INTEGER PRIMARY KEY,
        job_id INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
        run INTEGER NOT NULL,
        at REAL NOT NULL,
        trigger TEXT NOT NULL,           -- 'dump', 'hang', 'worker-lost', ...
        body TEXT NOT NULL               -- JSON list of ProcessStack
    );
    CREATE INDEX stacks_by_run ON stacks(job_id, run, at);
    CREATE INDEX findings_by_run ON findings(job_id, run, at);
    CREATE TABLE gpu_claims (
        gpu_index INTEGER PRIMARY KEY,   -- one claim per GPU: the key makes two claims impossible
        job_id INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
        run INTEGER NOT NULL,
        claimed_at REAL NOT NULL
    );
    """,
    # 4: who each process was in a distributed job (RANK, LOCAL_RANK, GROUP_RANK), so that status, dump and
    # explain name ranks; an ended process's ended_at is the moment of death where it is known
    """
    ALTER TABLE processes ADD COLUMN rank INTEGER;
    ALTER TABLE processes ADD COLUMN local_rank INTEGER;
    ALTER TABLE processes ADD COLUMN group_rank INTEGER;
    """,
    # 5: samples worth plotting: I/O split into read and write, each GPU's share, and the tiers samples are
    # downsampled into as they age (store/rollup.py): one row per (tier, point), gauges as mean and max,
    # counters as their last value. Stored short, for a 30-day job on several GPUs to stay under 3 MiB:
    # memory in MiB (2 bytes a figure where bytes take 6). WITHOUT ROWID: the key is the row, with no
    # second copy in an index.
    """
    ALTER TABLE samples ADD COLUMN io_read_bytes INTEGER;
    ALTER TABLE samples ADD COLUMN io_write_bytes INTEGER;
    ALTER TABLE samples ADD COLUMN gpus TEXT;        -- JSON [[index, util, memory_bytes], ...]
    CREATE TABLE samples_rollup (
        job_id INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
        run INTEGER NOT NULL,
        tier INTEGER NOT NULL,           -- seconds per point: 10, 60, 600
        at REAL NOT NULL,                -- start of the point's interval
        n INTEGER NOT NULL,              -- readings merged: the weight of its means
        nprocs_avg REAL, nprocs_max INTEGER,
        cpu_avg REAL, cpu_max REAL,
        rss_avg_mib INTEGER, rss_max_mib INTEGER,
        cpu_time_s REAL, io_read_bytes INTEGER, io_write_bytes INTEGER,
        gpu_util_avg REAL, gpu_util_max REAL,
        gpu_mem_avg_mib INTEGER, gpu_mem_max_mib INTEGER,
        gpus TEXT,                       -- JSON [[index, util_avg, mem_avg_mib, mem_max_mib], ...]
        PRIMARY KEY (job_id, run, tier, at)
    ) WITHOUT ROWID;
    """,
    # 6: `ps` reads the unfinished runs, and /metrics the recently ended ones too, by index instead of reading
    # every run of a long history
    """
    CREATE INDEX runs_by_state ON runs(state);
    CREATE INDEX runs_by_end ON runs(ended_at);
    """,
    # 7: findings with a life (a finding that stops being true is resolved, with the moment), and each
    # ended run's verdict (its first finding) kept with it, for the lists (`ps`, the web, `top`) to show
    # without judging every run again
    """
    ALTER TABLE findings ADD COLUMN resolved_at REAL;
    ALTER TABLE runs ADD COLUMN verdict_rule TEXT;
    ALTER TABLE runs ADD COLUMN verdict_title TEXT;
    """,
    # 8: everyday habits (issue 21): the job a rerun came from; the boot a run was supervised in (a reboot
    # ends it); processes left running on purpose at a run's end (--keep-running); named queues
    # (--queue, `jobwarden queue NAME --parallel N`) and the runs waiting in or holding a place of one
    """
    ALTER TABLE jobs ADD COLUMN rerun_of INTEGER;    -- `jobwarden rerun`: the job it repeats (may be removed)
    ALTER TABLE jobs ADD COLUMN queue TEXT;          -- --queue NAME
    ALTER TABLE runs ADD COLUMN boot_id TEXT;        -- /proc/sys/kernel/random/boot_id as its shim started
    ALTER TABLE runs ADD COLUMN kept TEXT;           -- JSON list of {pid, start_time, cmdline}
    CREATE TABLE queues (
        name TEXT PRIMARY KEY,
        parallel INTEGER NOT NULL        -- how many runs of the queue may run at once
    );
    CREATE TABLE queue_places (
        queue TEXT NOT NULL,
        job_id INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
        run INTEGER NOT NULL,
        holding INTEGER NOT NULL,        -- 0: waiting in line, 1: running in one of the queue's places
        since REAL NOT NULL,
        PRIMARY KEY (job_id, run)
    );
    CREATE INDEX queue_places_by_queue ON queue_places(queue, holding);
    """,
    # 9: progress (store/progress.py): each run's latest, kept after it ends ("stopped at 62 %"), and a series
    # beside the samples: the step, the step rate jobwarden measured and the metrics the job reported (loss),
    # in the same tiers (store/rollup.py)
    """
    CREATE TABLE progress (
        job_id INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
        run INTEGER NOT NULL,
        at REAL NOT NULL,                -- when it last changed
        step INTEGER, total INTEGER, unit TEXT, rate REAL, epoch REAL,
        source TEXT NOT NULL,            -- heartbeat | output
        format TEXT NOT NULL,            -- tqdm, keras, hf, megatron, heartbeat...
        observed TEXT,                   -- heartbeat | in-process | log
        label TEXT, rank INTEGER,
        closed INTEGER NOT NULL DEFAULT 0,
        stalled_since REAL,              -- the counter stands still while the job is busy, since then
        first_step INTEGER,              -- the run's first step seen: where a restarted run resumed
        metrics TEXT,                    -- JSON {name: number}
        PRIMARY KEY (job_id, run)
    ) WITHOUT ROWID;
    ALTER TABLE samples ADD COLUMN step INTEGER;
    ALTER TABLE samples ADD COLUMN step_rate REAL;
    ALTER TABLE samples ADD COLUMN metrics TEXT;    -- JSON {name: number}
    ALTER TABLE samples_rollup ADD COLUMN step INTEGER;    -- the last of the point
    ALTER TABLE samples_rollup ADD COLUMN step_rate_avg REAL;
    ALTER TABLE samples_rollup ADD COLUMN step_rate_max REAL;
    ALTER TABLE samples_rollup ADD COLUMN metrics TEXT;    -- JSON {name: mean over the point}
    """,
    # 10: the progress of the run, not only of its bar (issue 28): how many epochs it has, and whether the
    # step counts one epoch's batches (progress.epochs)
    """
    ALTER TABLE progress ADD COLUMN epochs INTEGER;
    ALTER TABLE progress ADD COLUMN per_epoch INTEGER;   -- 1: step/total is one epoch of `epochs`
    """,
    # 11: each run's fingerprint (store/fingerprints.py): what it was started with (the command, git, the
    # interpreter, the GPUs, the host), for `jobwarden diff` and `explain`. The package list, some
    # kilobytes, is kept once per distinct list (package_sets, by its hash): a thousand restarts in one
    # environment store it once. `same` says which runs are of the same command (the last success of a
    # command is found by index)
    """
    CREATE TABLE fingerprints (
        job_id INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
        run INTEGER NOT NULL,
        at REAL NOT NULL,
        same TEXT NOT NULL,              -- a hash of the command and its cwd
        body TEXT NOT NULL,              -- JSON: observations.Fingerprint without its packages
        packages TEXT,                   -- package_sets.hash; null: the list could not be read
        PRIMARY KEY (job_id, run)
    ) WITHOUT ROWID;
    CREATE INDEX fingerprints_by_command ON fingerprints(same);
    CREATE TABLE package_sets (
        hash TEXT PRIMARY KEY,
        list TEXT NOT NULL               -- JSON [[name, version], ...], sorted by name
    ) WITHOUT ROWID;
    """,
]

LATEST = len(MIGRATIONS)
