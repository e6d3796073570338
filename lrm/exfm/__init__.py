"""ExFM: a foundation-model teacher serving several students through augmented data.

    augment.py    the data augmentation system: the teacher's logit beside every impression
    students.py   students trained day by day on augmented data, their NE table

The student's auxiliary head and adapter are in lrm.models.exfm, its loss in
lrm.exfm.distill; the teacher is trained by the ordinary loop (lrm.train.loop).
"""
