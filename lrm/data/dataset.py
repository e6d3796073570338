"""A dataset folder, looked at once: its schema and layout, and its days' files.

Every reader of a dataset needs the same three facts (the schema from the first file's
metadata, the layout, the `day=D/*.parquet` files); a `Dataset` holds them so that a run
which builds several readers (train, validation and held-out loaders, the stats scan, the
checkpoint identity) lists the folder and opens the first footer once, not once a reader.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from lrm.data.schema import FeatureSchema, day_files, read_schema


@dataclass(frozen=True)
class Dataset:
    root: Path
    schema: FeatureSchema
    layout: str  # "impressions" | "sessions"
    files: dict[int, list[Path]]  # day -> its Parquet files, sorted

    @classmethod
    def open(cls, root: Path | Dataset) -> Dataset:
        """The folder's schema, layout and day files (a Dataset is returned as it is)."""
        if isinstance(root, Dataset):
            return root
        files = day_files(Path(root))  # a DataError naming the folder when it has no days
        schema, layout = read_schema(next(iter(files.values()))[0])
        return cls(Path(root), schema, layout, files)

    @property
    def days(self) -> list[int]:
        return list(self.files)

    def check_foreign(self, days: Sequence[int]) -> None:
        """Check every value of the files of `days` that lrm did not write as they are now (a
        file from elsewhere, or one changed since lrm wrote it: lrm.io.written_by_lrm), before
        a run or a stage writes anything: a bad value there is a DataError first. lrm's own
        files were checked as they were made (dedup checks every value it reads) and are
        checked again as the loader reads them."""
        from lrm import io
        from lrm.data import parquet, values

        for d in days:
            for f in self.files[d]:
                if not io.written_by_lrm(f):
                    for _ in parquet.iter_batches(f, 1 << 16,
                                                  check=values.checker(self.schema, f)):
                        pass
