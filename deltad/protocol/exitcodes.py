"""Exit codes of `delta`: the one contract the client keeps and the daemon reads.

Also listed in `delta --help` and the README; `deltad` logs each resume's exit with its
`MEANING` and counts only codes outside `RUN_OUTCOMES` as a failed resume.
"""

COMPLETED = 0
FAILED = 1
USAGE = 2  # bad arguments, invalid agent config, unreadable workspace state
CANCELED = 4  # a human canceled the run (an approval decision)
MODEL_UNAVAILABLE = 69  # EX_UNAVAILABLE: the model endpoint failed transiently; run resumable
BUSY = 75  # another process is driving a run in this workspace (EX_TEMPFAIL: try later)
WAITING = 101  # paused for a human answer
INTERRUPTED = 130  # SIGINT/SIGTERM

MEANING = {
    COMPLETED: "completed",
    FAILED: "failed",
    USAGE: "usage_error",
    CANCELED: "canceled",
    MODEL_UNAVAILABLE: "model_unavailable",
    BUSY: "busy",
    WAITING: "waiting",
    INTERRUPTED: "interrupted",
}

# Set by deltad in every resume's environment (value "deltad"): a resume that finds the run
# already taken or finished by another process exits BUSY, not USAGE (docs/daemon.md).
RESUMED_BY = "DELTA_RESUMED_BY"

# A verdict on the run, not a failure to resume it.
RUN_OUTCOMES = frozenset({COMPLETED, FAILED, CANCELED, MODEL_UNAVAILABLE, WAITING, INTERRUPTED})

HELP = """\b
Exit codes:
  0    completed
  1    failed
  2    usage or config error
  4    canceled by a human
  69   model endpoint unavailable (outage): the run is INTERRUPTED, resumable
  75   busy: another process is driving a run in this workspace (or, for a
       resume deltad started, already took or finished the run)
  101  waiting for input
  130  interrupted (SIGINT/SIGTERM)
"""
