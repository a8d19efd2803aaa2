"""The run directory and everything that reads or writes it.

checkpoint.py  atomic checkpoints: save, load, rotate
intact.py      which checkpoint a resume, eval or export uses: damaged ones named and skipped
resume.py      what a resume may change (changes.jsonl) and which --output-dir a new run may use
atomic.py      small files (config.yaml, data_report.json, ...) written atomically
jsonl.py       metrics.jsonl / rollouts.jsonl, kill-safe JSON lines
lock.py        one process per run (or eval output) directory: DIR/.lock
records.py     what one step writes there
console.py     the console, progress bars and the step line
faults.py      signals, non-finite updates, full disks, out of memory
trackers.py    TensorBoard, W&B, ... through Accelerate
readers.py     reading runs back: thinkrl compare / show / plot
plot.py        thinkrl plot
export.py      thinkrl export
"""
