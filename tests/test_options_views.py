"""ViewsMadeOnce: one view per options class, with the values every view shares."""
from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions, StandardOptions

from pipeline.options import FlatTokensOptions, ViewsMadeOnce


def test_a_view_is_made_once_per_class_and_reads_the_command_line():
    options = ViewsMadeOnce(["--runner", "DirectRunner", "--input", "a.jsonl", "--seed", "7"])
    assert options.view_as(StandardOptions) is options.view_as(StandardOptions)
    assert options.view_as(StandardOptions).runner == "DirectRunner"
    ft = options.view_as(FlatTokensOptions)
    assert (ft.input, ft.seed) == (["a.jsonl"], 7)


def test_a_value_set_through_one_view_is_seen_by_every_view_and_the_options():
    options = ViewsMadeOnce(["--temp_location", "/tmp/a"])
    options.view_as(GoogleCloudOptions).temp_location = "/tmp/b"
    assert options.view_as(GoogleCloudOptions).temp_location == "/tmp/b"
    assert options.get_all_options()["temp_location"] == "/tmp/b"
    plain = PipelineOptions(["--temp_location", "/tmp/a"])
    plain.view_as(GoogleCloudOptions).temp_location = "/tmp/b"
    assert options.get_all_options() == plain.get_all_options()
