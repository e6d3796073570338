"""Streaming retraining, one day at a time (the library side of flows/streaming.py).

For each new day D (D >= T = exfm.teacher_days; days [0, T) are the first teacher's):

    get the day          sources.py   the next synthetic day, or a file dropped in the inbox
    dedup                days.py      raw/day=D -> sessions/day=D (RecD)
    collisions           days.py      how many ids share a hashed row today (the day report)
    teacher              models.py    on its own cadence: resumed from its checkpoint chain,
                                      trained on the days since its last window, scored on D
                                      against the champion, registered, promoted on NE
    augment              (stage augment, run by the flow) D (and D + 1) with the champion
    evaluation data      days.py      day D + 1 when it is there, else D's held-out last slice
    students             models.py    each resumed from its checkpoint chain, trained on D,
                                      scored with the champion on the same data, registered,
                                      promoted only when NE improves (lrm.registry)
    report               report.py    NE/AUC/calibration of champion and challenger, the
                                      decisions and why, the collision table
    record               ledger.py    the day is done: keyed on its inputs' content and params

A day already done is a no-op; a day that failed runs again from where it stopped (each
step skips what it finds complete); a failure leaves the champions, the augmented days
and the checkpoint chains as they were (every write is atomic, and @champion moves last).
"""
