"""A pipeline whose elements take longer to encode than Beam's timed data-plane flush waits
(1 s), run on the launcher's own runner (pipeline.run.in_process_runner) with
--direct_running_mode multi_threading; exits 0 when every element arrived whole.

Run as `python -m tests.slow_elements`, in a process of its own: with the timed flush on, the
runner decoded half elements, and garbage lengths in them once made it allocate 22 GB."""
import sys
import time

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to

from pipeline.run import in_process_runner


class SlowToEncode:
    def __init__(self, text: str):
        self.text = text


class SlowCoder(beam.coders.Coder):
    """Sleeps between the key, which the runner has by then, and the value of each element."""

    def encode(self, value):
        time.sleep(0.35)
        return value.text.encode()

    def decode(self, encoded):
        return SlowToEncode(encoded.decode())

    def is_deterministic(self):
        return True


def main(argv) -> None:
    beam.coders.registry.register_coder(SlowToEncode, SlowCoder)
    options = PipelineOptions(argv)
    with beam.Pipeline(runner=in_process_runner(options), options=options) as p:
        grouped = (p
                   | beam.Create(range(8))
                   | beam.Map(lambda i: (f"key{i % 2}", SlowToEncode(f"value {i}"))).with_output_types(
                       tuple[str, SlowToEncode])
                   | beam.GroupByKey()
                   | beam.MapTuple(lambda key, values: (key, sorted(v.text for v in values))))
        assert_that(grouped, equal_to([("key0", [f"value {i}" for i in (0, 2, 4, 6)]),
                                       ("key1", [f"value {i}" for i in (1, 3, 5, 7)])]))


if __name__ == "__main__":
    main(sys.argv[1:])
