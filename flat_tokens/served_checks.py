"""What flat_tokens.reader checks of the data it serves, as it decodes it (docs/reader.md).

A chunk's checksum proves its bytes are the ones written to that key; it cannot prove that
the split's arrays agree with each other: an `encoded_tokens` shape edited larger serves the
fill value (zeros) past the last token, one edited smaller made `for ids in split` loop
forever, a `seq_starts` chunk copied from another build serves overlapping or empty
sequences, and a lowered `max_token_id` lets ids through that the trainer's embedding table
does not hold. `flat-tokens verify` reads everything and finds these; a trainer does not run
it before every job, so the reader checks what it is about to serve, on the arrays it has just
read, with vectorised numpy (a few passes over data already in memory):

* at open: ``seq_starts[0] == 0`` and ``seq_starts[-1] == len(encoded_tokens)`` (the shapes
  agree with the data, so no read runs past the tokens);
* every read of seq_starts: strictly increasing (no overlapping, no empty sequence), and
  continuing from the entry before it where the reader holds that entry, within
  [0, num_tokens], 0 at index 0 and num_tokens at the last index;
* every read of encoded_tokens: no decoded id above the split's max_token_id;
* every sequence served whole: its first token carries the start bit (a seq_starts entry that
  points elsewhere is another dataset's boundary).

Each failure is an InconsistentData (a DatasetError) naming the array, the index, the chunk
and the values at fault. Imports numpy only (and read_guard's exceptions).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from flat_tokens.read_guard import DatasetError

TOKENS = "encoded_tokens"
SEQ_STARTS = "seq_starts"
MAX_ID = 2**31 - 1  # the format's bound on a token id


class InconsistentData(DatasetError):
    """A split's arrays disagree with each other or with its attributes: serving them would
    serve zeros, overlapping or empty sequences, or ids above max_token_id."""


@dataclass(frozen=True)
class SplitChecks:
    """The checks of one split's reads: its URL and name (for the messages), its token count,
    sequence count, max_token_id and the two arrays' chunk lengths (to name a chunk)."""

    url: str
    split: str
    num_tokens: int
    num_sequences: int
    max_token_id: int
    tokens_chunk: int
    starts_chunk: int

    def _fail(self, array: str, index: int, chunk: int, what: str) -> InconsistentData:
        return InconsistentData(f"{self.url}: {self.split}/{array}[{index}] (chunk {index // max(1, chunk)}) {what}; "
                                f"the split's arrays disagree, so it cannot be served (a chunk or metadata edited, or "
                                f"copied from another dataset?); run flat-tokens verify, and rewrite it with "
                                f"--overwrite")

    def ends(self, first: int, last: int) -> None:
        """seq_starts[0] and seq_starts[-1] (read at open) against the token count."""
        if first != 0:
            raise self._fail(SEQ_STARTS, 0, self.starts_chunk, f"is {first}, not 0")
        if last != self.num_tokens:
            raise self._fail(SEQ_STARTS, self.num_sequences, self.starts_chunk,
                             f"is {last}, but {TOKENS} has {self.num_tokens} tokens (its shape): seq_starts must end "
                             f"at the token count")

    def starts(self, values: np.ndarray, first: int, previous: int | None = None) -> None:
        """values = seq_starts[first:first + len(values)], just read; `previous` is
        seq_starts[first - 1] when the caller holds it."""
        if values.size == 0:
            return
        head = int(values[0])
        if first == 0 and head != 0:
            raise self._fail(SEQ_STARTS, 0, self.starts_chunk, f"is {head}, not 0")
        if previous is not None and head <= previous:
            raise self._not_increasing(first, head, previous)
        if values.size > 1:
            falls = values[1:] <= values[:-1]
            if falls.any():
                k = int(np.argmax(falls)) + 1
                raise self._not_increasing(first + k, int(values[k]), int(values[k - 1]))
        tail = int(values[-1])  # the largest, now that they increase
        end = first + values.size - 1
        if tail > self.num_tokens or (end == self.num_sequences and tail != self.num_tokens):
            raise self._fail(SEQ_STARTS, end, self.starts_chunk,
                             f"is {tail}, but {TOKENS} has {self.num_tokens} tokens (its shape)")

    def _not_increasing(self, index: int, value: int, previous: int) -> InconsistentData:
        kind = "an empty sequence" if value == previous else "overlapping sequences"
        return self._fail(SEQ_STARTS, index, self.starts_chunk,
                          f"is {value}, not greater than seq_starts[{index - 1}] = {previous} ({kind})")

    def tokens(self, values: np.ndarray, first: int) -> None:
        """values = encoded_tokens[first:first + len(values)], just read: no id above
        max_token_id (an encoded value above 2 * max_token_id + 1)."""
        limit = 2 * self.max_token_id + 1
        if values.size == 0 or limit >= 2 * MAX_ID + 1:
            return
        if int(values.max()) > limit:
            k = int(np.argmax(values > np.uint32(limit)))
            raise self._fail(TOKENS, first + k, self.tokens_chunk,
                             f"holds token id {int(values[k]) >> 1}, above the split's max_token_id "
                             f"{self.max_token_id}")

    def sequences_begin(self, encoded: np.ndarray, offsets: np.ndarray, first_sequence: int,
                        first_token: int) -> None:
        """Sequences first_sequence... start at `offsets` of `encoded` (encoded_tokens from
        first_token): the token at each start carries the start bit."""
        marked = encoded[offsets] & np.uint32(1)
        if marked.all():  # the common case: one gather, one AND, one test
            return
        k = int(np.argmin(marked))
        raise self._fail(SEQ_STARTS, first_sequence + k, self.starts_chunk,
                         f"= {first_token + int(offsets[k])} points at a token without the start bit: not a "
                         f"sequence start of this split")
