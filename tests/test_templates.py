"""Deployment templates (templates/): the Dataflow Flex Template (metadata.json, launcher), the
Flink launch script, and the scheduled-run examples. Offline; the option list is derived from
FlatTokensOptions at test time, so a new option fails here until the templates account for it."""
import argparse
import ast
import ctypes
import ctypes.util
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import re2
import yaml
import zarr
from apache_beam.options.pipeline_options import FlinkRunnerOptions, PipelineOptions, StandardOptions

from pipeline import template_metadata
from pipeline.options import (DEFAULT_SHARD_MB, NEAR_OPTIONS, OPTIONS, FlatTokensOptions, OptionError, Template,
                              check_options, unknown_options, validation_fraction)
from tests.helpers import REPO, SAMPLE

TEMPLATES = REPO / "templates"
DATAFLOW = TEMPLATES / "dataflow"
METADATA = DATAFLOW / "metadata.json"
LAUNCHER = DATAFLOW / "main.py"
SCHEDULED = TEMPLATES / "scheduled"
DAG = SCHEDULED / "flat_tokens_daily_dag.py"
FLINK = TEMPLATES / "flink"
LAUNCH_SH = FLINK / "launch.sh"

# Options of FlatTokensOptions that are deliberately not template parameters, and why (the option
# table says so in place of a Template).
NOT_PARAMETERS = {o.name: o.template for o in OPTIONS if not isinstance(o.template, Template)}
# Options that take open-ended values but whose template parameter offers a fixed set:
# plugin backends (module:factory) are for custom code, not for launches from the console.
ENUM_SUBSETS = {"tokenizer_backend": {"auto", "hf", "fastokens"}}
# Parameters whose value is free text: no regex to check.
FREE_TEXT = {"text_key"}
# Options of which the job needs exactly one: each is optional as a parameter (metadata.json
# cannot say "one of"), and the job refuses neither and both with exit 2.
ONE_OF = {"input", "mixture"}
# Beam pipeline options (not FlatTokensOptions) that launch requests may pass as parameters.
BEAM_PARAMETERS = {"sdk_container_image"}

# The Dataflow API's TemplateMetadata / ParameterMetadata fields (dataflow v1b3).
METADATA_FIELDS = {"name", "description", "parameters", "streaming", "defaultStreamingMode",
                   "supportsAtLeastOnce", "supportsExactlyOnce", "yamlDefinition"}
PARAMETER_FIELDS = {"name", "label", "helpText", "isOptional", "regexes", "paramType", "enumOptions",
                    "defaultValue", "groupName", "parentName", "parentTriggerValues", "hiddenUi",
                    "customMetadata"}
PARAM_TYPES = {"DEFAULT", "TEXT", "GCS_READ_BUCKET", "GCS_WRITE_BUCKET", "GCS_READ_FILE", "GCS_WRITE_FILE",
               "GCS_READ_FOLDER", "GCS_WRITE_FOLDER", "PUBSUB_TOPIC", "PUBSUB_SUBSCRIPTION", "BIGQUERY_TABLE",
               "JAVASCRIPT_UDF_FILE", "SERVICE_ACCOUNT", "MACHINE_TYPE", "KMS_KEY_NAME", "WORKER_REGION",
               "WORKER_ZONE", "BOOLEAN", "ENUM", "NUMBER", "KAFKA_TOPIC", "KAFKA_READ_TOPIC",
               "KAFKA_WRITE_TOPIC"}

GCS_INPUTS = (
    ["gs://my-bucket/corpus/*.jsonl.zst", "gs://my-bucket/corpus/", "gs://a.b-c_d/x/part-0001.jsonl.gz",
     "gs://my-bucket/dir with space/x.jsonl", "gs://my-bucket/c/[0-9]*.jsonl"],
    ["/local/corpus.jsonl", "corpus/*.jsonl", "s3://my-bucket/x.jsonl", "gs://my-bucket", "gs://my-bucket/",
     "gs://My-Bucket/x", "gs://b/x", "gs://-bucket/x", "gs://my-bucket/x\n", "gs://my-bucket/x ", ""],
)
POSITIVE_INT = (["1", "64", "1048576"], ["0", "-1", "", "1.5", "01", "x", "1e6", " 1"])
NON_NEGATIVE_INT = (["0", "1", "64"], ["-1", "", "1.5", "x", "1234567890"])
# Python's float() reads all of these, and so does the command line.
SCIENTIFIC_BELOW_1 = ["1e-3", "1E-3", "5e-1", "2.5e-2", ".5e-1", "9.99e-1", "1e-05"]
NOT_FRACTIONS = ["1e3", "5e0", "1e+3", "e-3", "1e-", "-1e-3", "1e-3 ", "0x1", "1e-3e-1", "nan", "inf"]
# name -> (values the regexes must accept, values they must reject)
SAMPLES = {
    "input": GCS_INPUTS,
    "validation_input": GCS_INPUTS,
    "output": (["gs://my-bucket/flat-tokens/2024-06-01.zarr", "gs://my-bucket/out.zarr", "gs://my-bucket/a/b/"],
               ["gs://my-bucket/", "gs://my-bucket", "gs://my-bucket/*.zarr", "gs://my-bucket/a b.zarr",
                "/tmp/x.zarr", "file:///tmp/x.zarr", "gs://my_bucket", "gs://MY-BUCKET/x.zarr", ""]),
    "rejected_output": (["gs://my-bucket/flat-tokens/2024-06-01.rejected", "gs://my-bucket/rejected/"],
                        ["gs://my-bucket/", "/tmp/rejected", "gs://my-bucket/*.rejected", ""]),
    "tokenizer": (["bytes", "gs://my-bucket/tokenizers/tokenizer.json", "gpt2", "deepseek-ai/DeepSeek-V3",
                   "Qwen/Qwen2.5-7B", "https://huggingface.co/gpt2/resolve/main/tokenizer.json", "json",
                   "org/json", "a.jso", "my-org/tok.v2.json5", "x.jsonl", "a/b.JSON"],
                  ["", "tokenizer.json", "/abs/tokenizer.json", "./tok", ".hidden", "a/b/c", "org/tokenizer.json",
                   "s3://b/tokenizer.json", "gs://my-bucket/", "http://x.org/tokenizer.json", "byt es", "-x", "a.json"]),
    "seed": (["0", "42", "123456789012345678", "9999999999999999999"],
             ["", "-1", "1.5", "abc", "1e3", "0x10", " 1", "18446744073709551616"]),
    "validation_fraction": (["0", "0.01", "0.5", ".25", "0.999", "0.", *SCIENTIFIC_BELOW_1],
                            ["1", "1.0", "-0.1", "", "abc", "0,01", "2", "1e-0", "10e-1", *NOT_FRACTIONS]),
    "num_shards": NON_NEGATIVE_INT,
    "overwrite": (["true", "false"], ["True", "yes", "1", "", "--overwrite"]),
    "restart": (["true", "false"], ["True", "yes", "1", "", "--restart"]),
    "no_staging": (["true", "false"], ["True", "yes", "1", "", "--no_staging"]),
    "zarr_format": (["2", "3"], ["1", "4", "v2", "", "2.0"]),
    "tokens_chunk_size": POSITIVE_INT,
    "seq_starts_chunk_size": POSITIVE_INT,
    "chunks_per_shard": NON_NEGATIVE_INT,
    "codec": (["blosc-zstd", "blosc-lz4", "zstd"], ["lz4", "gzip", "", "BLOSC-ZSTD", "blosc-zstd "]),
    "mixture": (["gs://my-bucket/mixtures/web-code.yaml", "gs://my-bucket/m.json", "gs://a.b-c_d/x y/mix.yml"],
                ["", "gs://my-bucket/", "gs://my-bucket/dir/", "/local/mix.yaml", "mix.yaml", "gs://my-bucket/*.yaml",
                 "gs://my-bucket", "gs://My-Bucket/m.yaml", "gs://my-bucket/m.yaml "]),
    "dedup": (["none", "exact", "near"], ["", "NONE", "fuzzy", "exact ", "near "]),
    "tokenizer_backend": (["auto", "hf", "fastokens"], ["", "HF", "tokie", "auto ", "tests.wrong_backends:x"]),
    "tokenizer_check_fraction": (["0", "0.001", "1", ".5", "1.0", *SCIENTIFIC_BELOW_1],
                                 ["1.5", "-0.1", "", "abc", "2", *NOT_FRACTIONS]),
    "max_rejected_fraction": (["0", "0.001", "1", "1.0", ".5", *SCIENTIFIC_BELOW_1],
                              ["1.5", "-0.1", "", "2", "1.01", "abc", *NOT_FRACTIONS]),
    "read_range_mb": POSITIVE_INT,
    "batch_documents": POSITIVE_INT,
}
# By template kind, for a parameter that SAMPLES does not name (a new option of a known kind).
KIND_SAMPLES = {
    "gcs_read": GCS_INPUTS, "gcs_write": SAMPLES["output"], "tokenizer": SAMPLES["tokenizer"],
    "uint64": SAMPLES["seed"], "count": NON_NEGATIVE_INT, "positive_int": POSITIVE_INT,
    "fraction": SAMPLES["max_rejected_fraction"], "fraction_below_1": SAMPLES["validation_fraction"],
    "flag": SAMPLES["overwrite"], "gcs_file": SAMPLES["mixture"],
}


def samples(name: str) -> tuple[list[str], list[str]]:
    """(values the parameter's regexes must accept, values they must reject)."""
    if name in SAMPLES:
        return SAMPLES[name]
    template = {o.name: o.template for o in OPTIONS}[name]
    if template.kind == "choice":
        values = [v for v, _, _ in template.choices]
        return values, ["", *(v.upper() for v in values if v.upper() != v), *(f"{v} " for v in values)]
    return KIND_SAMPLES[template.kind]


def load_metadata() -> dict:
    return json.loads(METADATA.read_text())


def parameters() -> dict[str, dict]:
    return {p["name"]: p for p in load_metadata()["parameters"]}


def job_options() -> dict[str, argparse.Action]:
    """FlatTokensOptions' own options, by name (without --), from a fresh parser."""
    parser = argparse.ArgumentParser(add_help=False)
    FlatTokensOptions._add_argparse_args(parser)
    return {a.option_strings[0][2:]: a for a in parser._actions if a.option_strings}


def required_options() -> set[str]:
    """The options check_options insists on, found by leaving each one out in turn."""
    base = {"input": "in.jsonl", "output": "out.zarr", "tokenizer": "bytes"}
    assert _check(base) is None, "check_options rejects the minimal --input/--output/--tokenizer set"
    required = set()
    for name, action in job_options().items():
        if name in base:
            if _check({k: v for k, v in base.items() if k != name}) is not None:
                required.add(name)
        elif action.required:
            required.add(name)
    return required


def _check(values: dict) -> str | None:
    argv = [f"--{k}={v}" for k, v in values.items()]
    try:
        check_options(PipelineOptions(argv).view_as(FlatTokensOptions))
    except OptionError as e:
        return str(e)
    return None


def load_launcher():
    spec = importlib.util.spec_from_file_location("flat_tokens_template_launcher", LAUNCHER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def dataset_ok(path) -> None:
    """`python -m flat_tokens.tools.verify PATH` accepts it (or, without flat_tokens/tools/verify.py, it is committed)."""
    if (REPO / "pipeline" / "verify.py").exists():
        proc = subprocess.run([sys.executable, "-m", "flat_tokens.tools.verify", str(path)], cwd=REPO,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    else:
        assert zarr.open_group(str(path), mode="r").attrs.get("complete") is True


def root_run_id(path) -> str:
    return zarr.open_group(str(path), mode="r").attrs["run_id"]


# ---------------------------------------------------------------------------------------------
# metadata.json


def test_metadata_is_well_formed():
    meta = load_metadata()
    assert set(meta) <= METADATA_FIELDS, set(meta) - METADATA_FIELDS
    assert isinstance(meta["name"], str) and meta["name"].strip()
    assert isinstance(meta["description"], str) and meta["description"].strip()
    assert isinstance(meta["parameters"], list) and meta["parameters"]
    names = [p["name"] for p in meta["parameters"]]
    assert len(names) == len(set(names)), "duplicate parameter names"
    for p in meta["parameters"]:
        assert set(p) <= PARAMETER_FIELDS, (p["name"], set(p) - PARAMETER_FIELDS)
        for key in ("name", "label", "helpText"):
            assert isinstance(p.get(key), str) and p[key].strip(), (p.get("name"), key)
        assert isinstance(p.get("isOptional", False), bool), p["name"]
        assert p.get("paramType", "TEXT") in PARAM_TYPES, p["name"]
        assert isinstance(p.get("regexes", []), list), p["name"]
        assert all(isinstance(r, str) for r in p.get("regexes", [])), p["name"]


def test_every_parameter_is_an_option_of_the_job():
    options = job_options()
    for name in parameters():
        assert name in options, f"metadata.json parameter {name!r} is not an option of FlatTokensOptions"


def test_metadata_json_is_generated_from_the_option_table():
    assert METADATA.read_text() == template_metadata.render(), (
        "templates/dataflow/metadata.json is not what the option table in pipeline/options.py generates; "
        "regenerate it: .venv/bin/python -m pipeline.template_metadata > templates/dataflow/metadata.json")


def test_every_option_of_the_job_is_a_parameter_or_deliberately_left_out():
    params = parameters()
    missing = sorted(set(job_options()) - set(params) - set(NOT_PARAMETERS))
    assert not missing, (f"FlatTokensOptions options missing from templates/dataflow/metadata.json: {missing}; "
                         f"give the option a Template in pipeline/options.py, or the reason it has none")
    assert not set(NOT_PARAMETERS) & set(params)
    assert all(isinstance(why, str) and len(why) > 20 for why in NOT_PARAMETERS.values()), NOT_PARAMETERS


def test_required_options_are_required_parameters_and_only_those():
    required = required_options()
    assert required == {"input", "output", "tokenizer"}
    assert required - ONE_OF == {o.name for o in OPTIONS if o.required}, "the option table's `required` disagrees"
    base = {"output": "out.zarr", "tokenizer": "bytes"}
    for name in ONE_OF:  # either one suffices; both are refused
        assert _check({**base, name: "x"}) is None, name
    assert _check({**base, **{name: "x" for name in ONE_OF}}) is not None
    for name, p in parameters().items():
        if name in ONE_OF:
            assert p.get("isOptional") is True, f"{name} is one of {sorted(ONE_OF)}: optional, the job checks"
        elif name in required:
            assert p.get("isOptional", False) is False, f"{name} is required by check_options"
        else:
            assert p.get("isOptional") is True, f"{name} has a default: mark it isOptional"


def effective_defaults() -> dict[str, str]:
    """Each option's value when it is not given, as a template parameter would spell it."""
    given = PipelineOptions([]).view_as(FlatTokensOptions)
    defaults = {}
    for name, action in job_options().items():
        value = getattr(given, name)
        if name == "validation_fraction":
            value = validation_fraction(given)
        if value is not None:
            defaults[name] = str(value).lower() if isinstance(value, bool) else str(value)
    return defaults


def test_the_defaults_metadata_states_are_the_jobs():
    """helpText's 'Default: X' and defaultValue are what the job does when the parameter is not given."""
    defaults, wrong = effective_defaults(), []
    for name, p in parameters().items():
        stated = re.findall(r"Default: ([^ ,]+?)[.,]?(?: |$)", p["helpText"])
        if name in defaults:
            if stated != [defaults[name]] or p.get("defaultValue", defaults[name]) != defaults[name]:
                wrong.append(f"{name}: metadata.json says {stated} ({p.get('defaultValue')}), the job {defaults[name]}")
        elif "defaultValue" in p or stated and name != "rejected_output":  # rejected_output: derived from output
            wrong.append(f"{name}: metadata.json states a default, the job has none")
    assert not wrong, wrong


def test_no_help_text_in_the_option_table_states_a_default():
    """Defaults are appended from the option's `default` (--help, metadata.json): a default written
    by hand in a help text is the one that goes stale."""
    for o in OPTIONS:
        texts = [o.help] + ([o.template.help or ""] if isinstance(o.template, Template) else [])
        assert not any("default" in t.lower() for t in texts), o.name


def test_parameter_kinds_match_the_options():
    options = job_options()
    for name, p in parameters().items():
        action = options[name]
        kind = p.get("paramType", "TEXT")
        if isinstance(action, argparse._StoreTrueAction):
            assert kind == "BOOLEAN", name
        elif name in ENUM_SUBSETS:
            assert kind == "ENUM" and {o["value"] for o in p["enumOptions"]} == ENUM_SUBSETS[name], name
        elif action.choices:
            assert kind == "ENUM", name
            assert {o["value"] for o in p["enumOptions"]} == {str(c) for c in action.choices}, name
        elif action.type in (int, float):
            assert kind == "NUMBER", name
        else:
            assert kind in {"TEXT", "GCS_READ_FILE", "GCS_READ_FOLDER", "GCS_WRITE_FILE", "GCS_WRITE_FOLDER"}, name


def test_every_regex_has_samples_and_every_other_parameter_is_free_text():
    params = parameters()
    with_regexes = {n for n, p in params.items() if p.get("regexes")}
    for name in with_regexes:
        assert samples(name), f"{name}: add sample values to SAMPLES or KIND_SAMPLES"
    assert set(SAMPLES) <= with_regexes, sorted(set(SAMPLES) - with_regexes)
    assert set(params) - with_regexes == FREE_TEXT


def readme_parameter_values() -> list[tuple[str, str]]:
    """(name, value) of every `--parameters` example in templates/dataflow/README.md's bash
    blocks, as gcloud splits them (`,` or the `^X^` delimiter), with BUCKET=my-bucket."""
    pairs = []
    for block in re.findall(r"```bash\n(.*?)```", (DATAFLOW / "README.md").read_text(), flags=re.S):
        words = shlex.split(block.replace("\\\n", " ").replace("$BUCKET", "my-bucket"), comments=True)
        for flag, arg in zip(words, words[1:]):
            if flag == "--parameters":
                delimiter = ","
                if m := re.match(r"\^(.)\^", arg):
                    delimiter, arg = m[1], arg[m.end():]
                pairs += [tuple(item.split("=", 1)) for item in arg.split(delimiter)]
    return pairs


def accepted_values(name: str) -> list[str]:
    """Values the parameter must accept: its samples, its example and default in metadata.json,
    and the README's examples."""
    p = parameters()[name]
    return [*samples(name)[0], *re.findall(r"Example: ([^ ]+)$", p["helpText"]),
            *([p["defaultValue"]] if "defaultValue" in p else []),
            *(value for n, value in readme_parameter_values() if n == name)]


def test_the_readme_examples_use_template_parameters():
    pairs = readme_parameter_values()
    assert len(pairs) >= 15, pairs
    names = {n for n, _ in pairs}
    assert names <= set(parameters()) | BEAM_PARAMETERS, names - set(parameters()) - BEAM_PARAMETERS
    assert {"validation_fraction", "tokenizer_check_fraction"} <= names


class PosixERE:
    """The C library's POSIX extended regular expressions (regcomp/regexec, as egrep), by ctypes."""
    _libc = ctypes.CDLL(ctypes.util.find_library("c"))
    REG_EXTENDED = 1

    def __init__(self, pattern: str):
        self._compiled = ctypes.create_string_buffer(4096)  # room for any libc's regex_t
        # the whole value: ^(...)$ around the pattern (anchors are valid anywhere in an ERE)
        code = self._libc.regcomp(self._compiled, f"^({pattern})$".encode(), self.REG_EXTENDED)
        if code:
            raise ValueError(f"regcomp rejects {pattern!r} (error {code})")

    def fullmatch(self, value: str) -> bool:
        return self._libc.regexec(self._compiled, value.encode(), 0, None, 0) == 0

    def __del__(self):
        self._libc.regfree(self._compiled)


# How each engine decides whether a whole value matches. Dataflow documents template regexes as
# POSIX egrep expressions and matches the whole value; RE2 is Google's engine.
ENGINES = {
    "python-re": lambda pattern: re.compile(pattern).fullmatch,
    "re2": lambda pattern: re2.compile(pattern).fullmatch,
    "posix-ere": lambda pattern: PosixERE(pattern).fullmatch,
}
WITH_REGEXES = sorted(n for n, p in parameters().items() if p.get("regexes"))


@pytest.mark.parametrize("engine", sorted(ENGINES))
@pytest.mark.parametrize("name", WITH_REGEXES)
def test_regexes_accept_valid_and_reject_invalid_values(name, engine):
    matchers = [ENGINES[engine](r) for r in parameters()[name]["regexes"]]
    for value in accepted_values(name):
        assert all(m(value) for m in matchers), f"{name}: {engine} rejects valid {value!r}"
    for value in samples(name)[1]:  # Dataflow checks the whole value
        assert not all(m(value) for m in matchers), f"{name}: {engine} accepts invalid {value!r}"


ESCAPABLE = set(".[]\\()*+?{}|^$")  # escaping anything else is undefined in POSIX EREs


def portability_problems(pattern: str) -> list[str]:
    """What in a regex RE2, POSIX EREs (and Java, JavaScript) do not all read alike."""
    problems = [] if pattern.startswith("^") and pattern.endswith("$") else ["not anchored ^...$"]
    outside, i = "", 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            if pattern[i + 1:i + 2] not in ESCAPABLE:
                problems.append(f"\\{pattern[i + 1:i + 2]}: a shorthand, or an escape of an ordinary character")
            outside += pattern[i:i + 2]
            i += 2
        elif c == "[":
            end = pattern.find("]", i + 1)
            if end < 0:
                return problems + ["[ without ]"]
            inside = pattern[i + 1:end]
            if "\\" in inside or "[" in inside or inside in ("", "^"):
                problems.append(f"[{inside}]: backslash, [ or [:class:] in a bracket expression, or ] as a member")
            outside += "[]"
            i = end + 1
        else:
            outside += c
            i += 1
    for construct in ("(?", "*?", "+?", "??", "}?", "*+", "++", "?+"):
        if construct in outside:
            problems.append(f"{construct}: lookaround, non-capturing group, flags, lazy or possessive quantifier")
    for low, high in re.findall(r"\{([0-9]+)(?:,([0-9]*))?\}", outside):
        if int(high or low) > 255:
            problems.append(f"{{{low},{high}}}: POSIX guarantees repeat counts up to 255 only")
    return problems


@pytest.mark.parametrize("name", WITH_REGEXES)
def test_regexes_keep_to_what_re2_and_posix_eres_read_alike(name):
    for pattern in parameters()[name]["regexes"]:
        assert portability_problems(pattern) == [], (name, pattern)


def test_the_portability_check_finds_the_constructs_it_forbids():
    for bad in (r"^(?!x)a$", r"^(?:a)$", r"^\d$", r"^\S+$", r"^[^\s]$", r"^[[:digit:]]$", r"^a*?$", r"^a{1,300}$",
                r"^\-$", r"^a", r"^[]a]$"):
        assert portability_problems(bad), bad
    assert portability_problems(r"^(gs://[a-z0-9._-]{1,220}|\.[0-9]+)$") == []


@pytest.mark.parametrize("name", WITH_REGEXES)
def test_values_the_regexes_accept_are_values_the_job_accepts(name):
    """A value that passes Dataflow's validation must not fail in the launcher afterwards."""
    launcher = load_launcher()
    for value in accepted_values(name):
        base = {"input": "gs://my-bucket/x.jsonl", "output": "gs://my-bucket/o.zarr", "tokenizer": "bytes"}
        if name == "mixture":
            del base["input"]
        extra = {"chunks_per_shard": ["--zarr_format=3"], "long_documents": ["--max_tokens=100"],
                 "dedup_report": ["--dedup=exact"], "dedup_against": ["--dedup=exact"],
                 **{n: ["--dedup=near"] for n in NEAR_OPTIONS}}.get(name, [])
        argv = launcher.template_argv([*(f"--{k}={v}" for k, v in base.items() if k != name),
                                       f"--{name}={value}", *extra])
        try:
            ft = PipelineOptions(argv).view_as(FlatTokensOptions)
        except SystemExit:
            pytest.fail(f"--{name}={value}: argparse rejects it")
        check_options(ft)
        if name == "overwrite":
            assert ft.overwrite is (value == "true")


def test_gcloud_accepts_the_metadata(tmp_path):
    gcloud = shutil.which("gcloud")
    if not gcloud:
        pytest.skip("gcloud is not installed")
    env = {**os.environ, "CLOUDSDK_CONFIG": str(tmp_path / "gcloud"), "CLOUDSDK_CORE_PROJECT": "my-project",
           "CLOUDSDK_CORE_DISABLE_PROMPTS": "1", "CLOUDSDK_CORE_DISABLE_USAGE_REPORTING": "true",
           "CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK": "true"}
    proc = subprocess.run(
        [gcloud, "dataflow", "flex-template", "build", "gs://my-bucket/templates/flat-tokens.json",
         "--image", "us-central1-docker.pkg.dev/my-project/flat-tokens/flat-tokens-template:0.1.0",
         "--sdk-language", "PYTHON", "--metadata-file", str(METADATA), "--print-only"],
        capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    spec = json.loads(proc.stdout[proc.stdout.index("{"):])
    assert [p["name"] for p in spec["metadata"]["parameters"]] == list(parameters())


# ---------------------------------------------------------------------------------------------
# Dockerfiles


def _dockerfile(path):
    lines, current = [], ""
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        current += line.rstrip("\\").strip() + " "
        if not line.rstrip().endswith("\\"):
            lines.append(current.strip())
            current = ""
    return lines


@pytest.mark.parametrize("path", [DATAFLOW / "Dockerfile", FLINK / "Dockerfile"], ids=["dataflow", "flink"])
def test_dockerfile_copies_existing_paths_from_the_repository_root(path):
    lines = _dockerfile(path)
    for line in lines:
        if line.startswith("COPY ") and "--from=" not in line:
            for src in line.split()[1:-1]:
                assert (REPO / src).exists(), f"{path.name}: COPY {src}: no such path at the repository root"
    assert any(line.startswith("COPY setup.py ") for line in lines)
    assert any("pip install" in line for line in lines)


def test_dataflow_dockerfile_is_a_python_flex_template():
    lines = _dockerfile(DATAFLOW / "Dockerfile")
    froms = [line.split()[1] for line in lines if line.startswith("FROM ")]
    assert "gcr.io/dataflow-templates-base/python311-template-launcher-base" in froms
    env = " ".join(line for line in lines if line.startswith("ENV "))
    assert 'FLEX_TEMPLATE_PYTHON_PY_FILE="${WORKDIR}/main.py"' in env
    assert 'FLEX_TEMPLATE_PYTHON_SETUP_FILE="${WORKDIR}/setup.py"' in env
    assert "COPY templates/dataflow/main.py ${WORKDIR}/main.py" in lines


def test_flink_dockerfile_extends_the_beam_sdk_image():
    lines = _dockerfile(FLINK / "Dockerfile")
    assert [line for line in lines if line.startswith("FROM ")] == ["FROM apache/beam_python3.11_sdk:${BEAM_VERSION}"]
    assert "ARG BEAM_VERSION=2.77.0" in lines
    import apache_beam
    assert apache_beam.__version__ == "2.77.0", "bump BEAM_VERSION in the Dockerfiles and launch.sh with apache-beam"


# ---------------------------------------------------------------------------------------------
# The launcher (templates/dataflow/main.py)


def test_template_argv_turns_template_booleans_into_flags_and_drops_blanks():
    t = load_launcher().template_argv
    assert t(["--overwrite=true"]) == ["--overwrite"]
    assert t(["--overwrite=True"]) == ["--overwrite"]
    assert t(["--overwrite=false"]) == []
    assert t(["--overwrite="]) == []
    assert t(["--overwrite"]) == ["--overwrite"]
    assert t(["--overwrite=maybe"]) == ["--overwrite=maybe"]  # left for argparse to reject (exit 2)
    assert t(["--validation_input=", "--seed=3"]) == ["--seed=3"]
    assert t(["--runner=DataflowRunner", "--project=p", "--input=gs://b/x"]) == \
        ["--runner=DataflowRunner", "--project=p", "--input=gs://b/x"]


TEMPLATE_VALUES = {  # every optional parameter, as Dataflow passes it (validation_input set, see below,
    # so validation_fraction may only be 0: a fraction together with validation_input is refused)
    "text_key": "text", "seed": "7", "validation_fraction": "0", "num_shards": "2", "overwrite": "false",
    "restart": "false", "no_staging": "false",
    "zarr_format": "3", "tokens_chunk_size": "8192", "seq_starts_chunk_size": "256", "chunks_per_shard": "2",
    "codec": "blosc-lz4", "max_rejected_fraction": "0.01", "read_range_mb": "1", "batch_documents": "128",
    "tokenizer_backend": "fastokens", "tokenizer_check_fraction": "0.5", "dedup": "near",
    "near_threshold": "0.7", "near_shingle": "tokens", "near_shingle_size": "3", "near_hashes": "128",
    "near_bands": "16",
    "record_sources": "true",
    "split_special_tokens": "true",
    "min_tokens": "2", "max_tokens": "4096", "long_documents": "split",
}
# The parameters `launched` cannot combine with its input/validation_input: see the mixture launch below.
LAUNCHED_APART = {"mixture", "dedup_against"}  # dedup_against: the next day's launch, below


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """templates/dataflow/main.py run as the Flex Template launcher runs it: one --name=value per
    parameter, on the DirectRunner, into .../flat-tokens/2024-06-01.zarr."""
    root = tmp_path_factory.mktemp("template-run")
    out = root / "flat-tokens" / "2024-06-01.zarr"
    summary = root / "summary.json"
    params = {"input": str(SAMPLE / "corpus-1.jsonl"), "validation_input": str(SAMPLE / "corpus-2.jsonl"),
              "output": str(out), "tokenizer": str(SAMPLE / "tokenizer.json"),
              "rejected_output": str(root / "rejected"), "dedup_report": str(root / "dedup-report"),
              **TEMPLATE_VALUES}
    argv = [f"--{k}={v}" for k, v in params.items()] + ["--runner=DirectRunner", f"--summary_json={summary}"]
    proc = subprocess.run([sys.executable, str(LAUNCHER), *argv], cwd=root, capture_output=True, text=True,
                          timeout=600)
    return types.SimpleNamespace(root=root, out=out, summary=summary, proc=proc, params=params)


@pytest.mark.slow
def test_launcher_runs_end_to_end_with_template_parameters(launched):
    assert set(launched.params) | LAUNCHED_APART == set(parameters()), "exercise every template parameter"
    for name, value in TEMPLATE_VALUES.items():  # the values are ones Dataflow lets through
        assert all(re.search(r, value) for r in parameters()[name].get("regexes", [])), name
    assert launched.proc.returncode == 0, launched.proc.stderr[-5000:]
    dataset_ok(launched.out)
    summary = json.loads(launched.summary.read_text())
    g = zarr.open_group(str(launched.out), mode="r")
    assert g.metadata.zarr_format == 3 and summary["stats"] == g.attrs["stats"]
    assert summary["stats"]["train"]["sequences"] > 0 and summary["stats"]["validation"]["sequences"] > 0


@pytest.mark.slow
def test_launcher_runs_a_mixture(tmp_path):
    mixture = tmp_path / "mix.yaml"
    mixture.write_text(f"sources:\n"
                       f"  - {{name: one, input: ['{SAMPLE / 'corpus-1.jsonl'}'], weight: 2}}\n"
                       f"  - {{name: two, input: ['{SAMPLE / 'corpus-2.jsonl'}'], weight: 1, max_epochs: 2}}\n")
    out = tmp_path / "mixed.zarr"
    argv = [f"--mixture={mixture}", f"--output={out}", "--tokenizer=bytes", "--dedup=exact", "--input="]
    assert load_launcher().main(argv) == 0
    dataset_ok(out)
    sources = zarr.open_group(str(out), mode="r").attrs["mixture"]["sources"]
    assert [s["name"] for s in sources] == ["one", "two"] and all(s["train_tokens"] > 0 for s in sources)


def test_relaunch_without_overwrite_is_refused_and_keeps_the_dataset(launched, capsys):
    assert launched.proc.returncode == 0
    before = root_run_id(launched.out)
    # The same job again (a scheduler's retry): already built, nothing rewritten, exit 0.
    argv = [f"--{k}={v}" for k, v in launched.params.items() if k != "overwrite"]
    assert load_launcher().main(argv) == 0
    assert f"was already built by run {before}" in capsys.readouterr().out
    # Another job on the same output: refused.
    reseeded = [a for a in argv if not a.startswith("--seed=")] + ["--seed=8"]
    assert load_launcher().main(reseeded) == 2
    assert "exists and is not empty" in capsys.readouterr().err
    assert load_launcher().main(reseeded + ["--overwrite=false"]) == 2
    assert root_run_id(launched.out) == before
    dataset_ok(launched.out)


def test_launcher_does_not_wait_for_a_dataflow_job(tmp_path, monkeypatch):
    """On Dataflow the launcher must return once the job is submitted, without summarizing an
    output that the job has not written yet."""
    import apache_beam as beam

    class DataflowPipelineResult:  # what DataflowRunner.run_pipeline returns
        has_job = True
        state = "RUNNING"

        def job_id(self):
            return "2024-06-01_00_00_00-123"

        def wait_until_finish(self, duration=None):
            raise AssertionError("the launcher blocked on a Dataflow job")

    monkeypatch.setattr(beam.Pipeline, "run", lambda self, *a, **k: DataflowPipelineResult())
    out = tmp_path / "out.zarr"
    argv = [f"--input={SAMPLE / 'corpus-1.jsonl'}", f"--output={out}", f"--tokenizer={SAMPLE / 'tokenizer.json'}"]
    assert load_launcher().main(argv) == 0


# ---------------------------------------------------------------------------------------------
# Scheduled runs


def test_dag_parses_without_airflow():
    tree = ast.parse(DAG.read_text(), filename=str(DAG))
    assert any(isinstance(n, ast.ImportFrom) and n.module == "airflow.providers.google.cloud.operators.dataflow"
               and any(a.name == "DataflowStartFlexTemplateOperator" for a in n.names) for n in ast.walk(tree))


class _Task:
    created: dict = {}

    def __init__(self, **kwargs):
        self.kwargs = kwargs
        _Task.created[kwargs["task_id"]] = self

    def __rshift__(self, other):
        return other


class _Dag:
    def __init__(self, **kwargs):
        self.kwargs = kwargs

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _LocalGCSHook:
    """GCSHook over a local directory: bucket root = _LocalGCSHook.root."""
    root: Path

    def exists(self, bucket_name, object_name):
        return (self.root / object_name).is_file()

    def download(self, bucket_name, object_name):
        return (self.root / object_name).read_bytes()


@pytest.fixture
def dag_module(monkeypatch):
    """The DAG file executed against stand-ins for the few Airflow names it uses."""
    _Task.created = {}
    for name in ("PROJECT", "REGION", "BUCKET", "TEMPLATE", "IMAGE", "TOKENIZER"):
        monkeypatch.delenv(f"FLAT_TOKENS_{name}", raising=False)
    modules = {
        "airflow": {"DAG": _Dag},
        "airflow.sdk": {"DAG": _Dag},
        "airflow.providers": {}, "airflow.providers.standard": {}, "airflow.providers.standard.operators": {},
        "airflow.providers.standard.operators.python": {"PythonOperator": _Task, "ShortCircuitOperator": _Task},
        "airflow.providers.google": {}, "airflow.providers.google.cloud": {},
        "airflow.providers.google.cloud.hooks": {},
        "airflow.providers.google.cloud.hooks.gcs": {"GCSHook": _LocalGCSHook},
        "airflow.providers.google.cloud.operators": {},
        "airflow.providers.google.cloud.operators.dataflow": {"DataflowStartFlexTemplateOperator": _Task},
    }
    for name, attrs in modules.items():
        module = types.ModuleType(name)
        module.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, module)
    spec = importlib.util.spec_from_file_location("flat_tokens_daily_dag", DAG)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.tasks = dict(_Task.created)
    return module


def render(value: str, ds: str = "2024-06-01") -> str:
    value = re.sub(r"\{\{\s*ds\s*\}\}", ds, value)
    value = re.sub(r"\{\{\s*ds_nodash\s*\}\}", ds.replace("-", ""), value)
    assert "{{" not in value and "{%" not in value, value
    return value


def check_launch_parameters(params: dict, where: str) -> None:
    """Names are template parameters, the required ones are there, overwrite is not, and every
    literal value passes the template's regexes (Workflows `${...}` expressions are not evaluated)."""
    meta = parameters()
    unknown = set(params) - set(meta) - BEAM_PARAMETERS
    assert not unknown, f"{where}: not template parameters: {sorted(unknown)}"
    assert {"input", "output", "tokenizer"} <= set(params), where
    assert "overwrite" not in params, f"{where}: a scheduled launch must never pass overwrite"
    for name, value in params.items():
        assert isinstance(value, str), (where, name)  # the launch API takes strings
        if value.startswith("${"):
            continue
        for regex in meta.get(name, {}).get("regexes", []):
            assert re.search(regex, value), f"{where}: {name}={value!r} fails the template's regex"


def test_dag_launches_dated_outputs_with_valid_parameters_and_no_overwrite(dag_module):
    build = dag_module.tasks["build"].kwargs
    assert build["wait_until_finished"] is True
    launch = build["body"]["launchParameter"]
    params = {k: render(v) for k, v in launch["parameters"].items()}
    check_launch_parameters(params, "flat_tokens_daily_dag.py")
    assert params["output"] == "gs://my-bucket/flat-tokens/2024-06-01.zarr"
    assert render(launch["jobName"]) == "flat-tokens-20240601"
    assert launch["containerSpecGcsPath"].startswith("gs://")


def test_dag_skips_committed_days_and_reads_their_summary(dag_module, launched, tmp_path):
    assert launched.proc.returncode == 0
    _LocalGCSHook.root = launched.root  # .../flat-tokens/2024-06-01.zarr, zarr format 3
    assert dag_module.not_built_yet(ds="2024-06-01") is False
    assert dag_module.not_built_yet(ds="2024-06-02") is True
    summary = dag_module.read_summary(ds="2024-06-01")
    assert summary["stats"] == json.loads(launched.summary.read_text())["stats"]
    with pytest.raises(RuntimeError, match="not committed"):
        dag_module.read_summary(ds="2024-06-02")
    # zarr format 2 keeps the root attributes in .zattrs
    _LocalGCSHook.root = tmp_path
    v2 = tmp_path / "flat-tokens" / "2024-06-03.zarr"
    v2.mkdir(parents=True)
    (v2 / ".zattrs").write_text(json.dumps({"complete": False, "stats": {}}))
    assert dag_module.not_built_yet(ds="2024-06-03") is True
    (v2 / ".zattrs").write_text(json.dumps({"complete": True, "stats": {"documents": 3}}))
    assert dag_module.not_built_yet(ds="2024-06-03") is False
    assert dag_module.read_summary(ds="2024-06-03")["stats"] == {"documents": 3}


def test_cloud_scheduler_body_and_workflow_use_template_parameters():
    body = json.loads((SCHEDULED / "launch-body.json").read_text())
    check_launch_parameters(body["launchParameter"]["parameters"], "launch-body.json")
    workflow = yaml.safe_load((SCHEDULED / "workflow.yaml").read_text())
    steps = {name: step for s in workflow["main"]["steps"] for name, step in s.items()}
    launch = steps["launch"]
    assert launch["call"] == "googleapis.dataflow.v1b3.projects.locations.flexTemplates.launch"
    params = launch["args"]["body"]["launchParameter"]["parameters"]
    check_launch_parameters(params, "workflow.yaml")
    assert params["output"] == "${output}"
    init = {k: v for a in steps["init"]["assign"] for k, v in a.items()}
    assert init["output"] == '${"gs://" + bucket + "/flat-tokens/" + ds + ".zarr"}'


@pytest.mark.slow
def test_run_daily_reports_an_already_built_day_and_refuses_overwrite(launched):
    assert launched.proc.returncode == 0
    script = str(SCHEDULED / "run_daily.sh")
    env = {**os.environ, "PYTHON": sys.executable}
    args = [str(launched.out), "--input", str(SAMPLE / "corpus-1.jsonl"), "--tokenizer", str(SAMPLE / "tokenizer.json")]
    proc = subprocess.run(["bash", script, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"output": str(launched.out), "already_built": True}
    proc = subprocess.run(["bash", script, *args, "--overwrite"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "not allowed" in proc.stderr


@pytest.mark.slow
def test_the_next_day_is_deduplicated_against_the_earlier_ones(launched, tmp_path):
    """run_daily.sh with --dedup passes the committed earlier dates under the prefix; a later
    date, an uncommitted one and another suffix are left out."""
    assert launched.proc.returncode == 0
    prefix = launched.out.parent
    (prefix / "2024-05-31.zarr").mkdir()  # a failed earlier day: nothing committed
    (prefix / "2024-06-09.zarr").mkdir()  # a later day
    (prefix / "2024-05-30.tmp").mkdir()  # another suffix
    day_2 = prefix / "2024-06-04.zarr"
    script = str(SCHEDULED / "run_daily.sh")
    env = {**os.environ, "PYTHON": sys.executable}
    proc = subprocess.run(["bash", script, str(day_2), "--input", str(SAMPLE / "corpus-1.jsonl"), "--tokenizer",
                           str(SAMPLE / "tokenizer.json"), "--dedup", "exact",
                           "--rejected_output", str(tmp_path / "rejected")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2024-05-31.zarr is not committed" in proc.stderr
    stats = json.loads(proc.stdout.strip().splitlines()[-1])["stats"]
    # Day 1 read corpus-1.jsonl too: every text of it that day 1's dedup kept is removed here.
    assert list(stats["dedup_against_by_dataset"]) == [str(launched.out)]
    assert stats["dedup_against"] > 0.9 * (stats["documents"] - stats["empty"] - stats["duplicates"])
    # The DAG passes the same window as a glob over the prefix: the launcher skips the
    # uncommitted matches and the output itself.
    day_3 = prefix / "2024-06-05.zarr"
    argv = [f"--input={SAMPLE / 'corpus-2.jsonl'}", f"--output={day_3}", "--tokenizer=bytes", "--dedup=exact",
            f"--dedup_against={prefix}/*.zarr", f"--rejected_output={tmp_path / 'rejected-3'}"]
    assert load_launcher().main(argv) == 0
    by_dataset = zarr.open_group(str(day_3), mode="r").attrs["stats"]["dedup_against_by_dataset"]
    assert list(by_dataset) == [str(launched.out), str(day_2)] and by_dataset[str(launched.out)] > 0


# ---------------------------------------------------------------------------------------------
# Flink


def test_flink_launch_script_submits_options_beam_accepts():
    assert subprocess.run(["bash", "-n", str(LAUNCH_SH)]).returncode == 0
    image = "registry.example/flat-tokens-beam-sdk:2.77.0"
    for env_type, config in (("DOCKER", image), ("EXTERNAL", "localhost:50000")):
        env = {**os.environ, "DRY_RUN": "1", "ENVIRONMENT_TYPE": env_type, "PARALLELISM": "32",
               "SDK_IMAGE": image, "JOB_HOST": "jobserver"}
        proc = subprocess.run(["bash", str(LAUNCH_SH), "run", "--input", "gs://my-bucket/c/*.jsonl", "--output",
                               "gs://my-bucket/o.zarr", "--tokenizer", "bytes"], env=env, capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        argv = shlex.split(proc.stdout.strip().splitlines()[-1])
        argv = argv[argv.index("pipeline.run") + 1:]
        assert unknown_options(argv) == [], argv
        options = PipelineOptions(argv)
        assert options.view_as(StandardOptions).runner == "PortableRunner"
        everything = options.get_all_options()
        assert everything["job_endpoint"] == "jobserver:8099"
        assert everything["environment_type"] == env_type and everything["environment_config"] == config
        assert everything["parallelism"] == 32
        check_options(options.view_as(FlatTokensOptions))
    assert launch_sh("bogus").returncode == 2


def newest(versions):
    return max(versions, key=lambda v: tuple(int(n) for n in v.split(".")))


# Beam publishes a Flink job server for each of these; the launch script defaults to the newest 1.x.
PUBLISHED_FLINK = list(FlinkRunnerOptions.PUBLISHED_FLINK_VERSIONS)
DEFAULT_FLINK = newest([v for v in PUBLISHED_FLINK if v.startswith("1.")] or PUBLISHED_FLINK)


def launch_sh(*args, **env):
    return subprocess.run(["bash", str(LAUNCH_SH), *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "DRY_RUN": "1", "PYTHON": sys.executable, **env})


@pytest.mark.slow
def test_flink_job_server_defaults_to_a_version_beam_publishes():
    import apache_beam
    beam = apache_beam.__version__
    proc = launch_sh("job-server")
    assert proc.returncode == 0, proc.stderr
    assert f" apache/beam_flink{DEFAULT_FLINK}_job_server:{beam} " in proc.stdout
    for version in PUBLISHED_FLINK:
        proc = launch_sh("job-server", FLINK_VERSION=version)
        assert proc.returncode == 0 and f" apache/beam_flink{version}_job_server:{beam} " in proc.stdout, proc.stderr
    for version in ("1.18", "9.9", "1.2"):  # no job server: refused before anything starts
        proc = launch_sh("job-server", FLINK_VERSION=version)
        assert proc.returncode == 2 and proc.stdout == "", proc.stdout
        assert f"FLINK_VERSION={version}" in proc.stderr and " ".join(PUBLISHED_FLINK) in proc.stderr
    proc = launch_sh("flink-versions")
    assert proc.stdout.splitlines() == [f"supported: {' '.join(PUBLISHED_FLINK)}", f"default: {DEFAULT_FLINK}"]


def test_flink_readme_lists_the_job_servers_beam_publishes():
    import apache_beam
    beam = apache_beam.__version__
    readme = (FLINK / "README.md").read_text()
    rows = re.findall(r"^\| `([0-9.]+)`( \(default\))? \| `apache/beam_flink([0-9.]+)_job_server:([0-9.]+)` "
                      r"\(`beam-runners-flink-([0-9.]+)-job-server-([0-9.]+)\.jar`\) \| ([0-9.]+)\.x \|$", readme, flags=re.M)
    assert [r[0] for r in rows] == PUBLISHED_FLINK, rows
    assert [r[0] for r in rows if r[1]] == [DEFAULT_FLINK]
    for version, _, image_flink, image_beam, jar_flink, jar_beam, cluster in rows:
        assert version == image_flink == jar_flink == cluster and image_beam == jar_beam == beam


def test_every_flink_version_the_flink_files_name_has_a_job_server():
    """Images, jars, docker tags and prose in templates/flink/ name only versions Beam publishes."""
    named = []
    for path in FLINK.iterdir():
        text = path.read_text()
        named += re.findall(r"beam_flink([0-9]+\.[0-9]+)_job_server|beam-runners-flink-([0-9]+\.[0-9]+)-job-server"
                            r"|flink:([0-9]+\.[0-9]+)|Flink ([0-9]+\.[0-9]+)", text)
    versions = {v for groups in named for v in groups if v}
    assert DEFAULT_FLINK in versions
    assert versions <= set(PUBLISHED_FLINK), versions - set(PUBLISHED_FLINK)


def test_shard_size_claims_are_the_codes():
    """'~N MiB of text' on a line about shards, wherever the docs say it, is DEFAULT_SHARD_MB."""
    files = [FLINK / "README.md", FLINK / "flink-conf.yaml", DATAFLOW / "README.md", METADATA,
             REPO / "README.md", REPO / "docs" / "design.md"]
    claims = {f.relative_to(REPO): [int(n) for line in f.read_text().splitlines() if "shard" in line.lower()
                                    for n in re.findall(r"([0-9]+) MiB[ -]of[ -]text", line)]
              for f in files}
    assert claims[Path("templates/flink/README.md")] and claims[Path("templates/dataflow/metadata.json")], claims
    assert all(n == DEFAULT_SHARD_MB for numbers in claims.values() for n in numbers), claims


@pytest.mark.slow
def test_flink_equivalent_runs_on_the_local_job_service_with_an_external_worker_pool(tmp_path):
    """`launch.sh local`: PortableRunner -> Beam's Python job service -> EXTERNAL worker pool, the
    same Job API and worker protocol as Beam's Flink job server (Flink itself cannot run here)."""
    out = tmp_path / "portable.zarr"
    env = {**os.environ, "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(LAUNCH_SH), "local", "--input", str(SAMPLE / "corpus-1.jsonl"),
                           "--tokenizer", str(SAMPLE / "tokenizer.json"), "--output", str(out)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-5000:]
    dataset_ok(out)
