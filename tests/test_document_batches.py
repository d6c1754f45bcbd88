"""DocumentBatcher: the batches both readers emit."""
from hypothesis import given
from hypothesis import strategies as st

from transforms.read.document_batches import DocumentBatcher


@given(texts=st.lists(st.text(max_size=30), max_size=60), batch_bytes=st.integers(1, 80),
       batch_documents=st.integers(1, 10))
def test_batches_keep_every_document_in_order_and_close_at_either_limit(texts, batch_bytes, batch_documents):
    batcher = DocumentBatcher("3:x.jsonl", "auto", batch_bytes, batch_documents)
    batches = []
    for place, text in enumerate(texts):
        if batcher.add(place * 10, text):
            batches.append(batcher.take())
    if batcher:
        batches.append(batcher.take())
    assert len(batcher) == 0
    assert [t for b in batches for t in b.texts] == texts
    assert [int(p) for b in batches for p in b.offsets] == [10 * i for i in range(len(texts))]
    for b in batches:
        assert (b.file_key, b.split) == ("3:x.jsonl", "auto")
        assert 0 < len(b.texts) <= batch_documents
        # a batch closes as soon as it reaches a limit: without its last document it was under both
        assert sum(map(len, b.texts[:-1])) < batch_bytes and len(b.texts) - 1 < batch_documents
    for b in batches[:-1]:  # every batch but the last was closed by a limit
        assert sum(map(len, b.texts)) >= batch_bytes or len(b.texts) == batch_documents
