"""The exit codes of ``ddpdoctor``, in one place.

====  =====================================================================================
0     the job succeeded and nothing diverged (``diff``: the traces are clean)
1     a problem was found: a rank crashed or diverged (``run``: or the job's own non-zero code,
      or the collective schedule differs from ``--expect-schedule``)
2     bad usage or unreadable input (``attach``: no job found, or no rank's stack readable)
3     ``run`` detected a hang (or a rank stuck in its own code), collected the evidence and
      stopped the job; ``attach``: ranks wait in collectives (0: none does)
4     ``run`` in CI mode (``--cpu``, ``--max-steps``, ``--junit``, ``--markdown`` or ``$CI``
      set): the run is not verified: nothing was tested (no collective was recorded on any
      rank, or one rank ran), or the traces do not reach the end (*incomplete*)
130   ``run`` was interrupted (SIGINT/SIGTERM); the job was stopped, the logs kept
====  =====================================================================================
"""

EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_USAGE = 2
EXIT_HANG = 3
EXIT_UNTESTED = 4  # and incomplete, in CI mode
EXIT_INTERRUPTED = 130
