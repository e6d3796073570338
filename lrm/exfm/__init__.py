"""ExFM: a foundation-model teacher serving several students through augmented data.

    augment.py    the data augmentation system: the teacher's logit beside every impression
    distill.py    the student loss: labels on the serving head, distillation on the aux head
    students.py   students trained day by day on augmented data, their NE table

The student's auxiliary head and adapter are in lrm.models.exfm; the teacher and the
students are trained by the ordinary loop (lrm.train).
"""
