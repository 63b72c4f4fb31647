"""How far a job has got: its progress, read from what it prints or reports, with no change to its code.

Pure functions and small stateful parsers over text and plain records: no I/O, no clock reads (the shim
reads the files and passes the time in; see shim/watch/progresswatch.py). Kept low in the layers so that the
store, the rules and every frontend share one `Progress`.

- `model`: `Reading` (one report: a bar's frame, a log line, an in-process bar, a heartbeat), `Bar` (a
  bar seen in-process by the hooks) and `Progress` (what every frontend shows, the JSON contract);
- `frames`: the job's output split into frames per torchrun rank (carriage-return redraws, ANSI,
  `[rankN]:`/`[defaultN]:` prefixes, even inserted mid-line), each with its bar position;
- `formats`: one frame parsed: tqdm (and so Lightning, HF, accelerate), Keras 2 and 3, HF Trainer's log
  dicts, Megatron, DeepSpeed, torchtitan and fairseq lines;
- `output`: the newest frame of each bar across reads of the log, the outer bar chosen;
- `sources`: heartbeat info and in-process bars as readings, and the choice between the sources;
- `stepclock`: the rate measured on jobwarden's own clock, the ETA, how long the counter has stood still.

The formats are those of research/slowness.md §3 (tested regexes and pitfalls there).
"""
