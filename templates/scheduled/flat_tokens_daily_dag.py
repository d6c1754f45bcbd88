"""Airflow DAG: build one flat-tokens dataset per day with the Dataflow Flex Template.

Each run writes gs://BUCKET/flat-tokens/{{ ds }}.zarr from that day's corpus. The launch never
passes `overwrite`, so the pipeline refuses an output that exists and is not empty: a
re-triggered or retried run can never clobber a finished dataset (nor the remains of a failed
run, which someone must look at first; see README.md, "Recovering a failed day").

Tasks:
  already_built  skips the rest when the day's dataset is already committed (its root
                 attributes say complete: true), so re-triggering a finished day is a green
                 no-op instead of a failed launch. Without this task the refusal still protects
                 the data; the launch would just fail (exit 2 in the launcher log).
  build          DataflowStartFlexTemplateOperator, waits for the job's terminal state:
                 JOB_STATE_DONE = exit 0 (dataset committed); a failed job or a failed launch
                 (exit 1 or 2 of pipeline.run) fails the task.
  summary        reads the committed dataset's root attributes (`complete`, `stats`: the same
                 numbers that `--summary_json` writes for a local run) and returns them as the
                 task's XCom; fails when the dataset is not committed.

Configure with environment variables of the Airflow scheduler and workers (or edit the
defaults below): FLAT_TOKENS_PROJECT, FLAT_TOKENS_REGION, FLAT_TOKENS_BUCKET,
FLAT_TOKENS_TEMPLATE (gs:// path of the template spec), FLAT_TOKENS_IMAGE (the template image,
also used as the workers' SDK container), FLAT_TOKENS_TOKENIZER.

Needs apache-airflow-providers-google on the Airflow workers (nothing from this repository).
"""
from __future__ import annotations

import json
import os
from datetime import datetime, timedelta

try:  # Airflow 3
    from airflow.sdk import DAG
    from airflow.providers.standard.operators.python import PythonOperator, ShortCircuitOperator
except ImportError:  # Airflow 2
    from airflow import DAG
    from airflow.operators.python import PythonOperator, ShortCircuitOperator
from airflow.providers.google.cloud.hooks.gcs import GCSHook
from airflow.providers.google.cloud.operators.dataflow import DataflowStartFlexTemplateOperator

# Deployment settings: from the scheduler's environment (no metadata-database access while the
# DAG file is parsed), with these defaults.
PROJECT = os.environ.get("FLAT_TOKENS_PROJECT", "my-project")
REGION = os.environ.get("FLAT_TOKENS_REGION", "us-central1")
BUCKET = os.environ.get("FLAT_TOKENS_BUCKET", "my-bucket")
TEMPLATE = os.environ.get("FLAT_TOKENS_TEMPLATE", f"gs://{BUCKET}/templates/flat-tokens-0.1.0.json")
IMAGE = os.environ.get("FLAT_TOKENS_IMAGE",
                       f"{REGION}-docker.pkg.dev/{PROJECT}/flat-tokens/flat-tokens-template:0.1.0")
TOKENIZER = os.environ.get("FLAT_TOKENS_TOKENIZER", f"gs://{BUCKET}/tokenizers/tokenizer.json")

OUTPUT_PREFIX = "flat-tokens"  # inside BUCKET
OUTPUT = f"gs://{BUCKET}/{OUTPUT_PREFIX}/{{{{ ds }}}}.zarr"  # -> gs://my-bucket/flat-tokens/2024-06-01.zarr
INPUT = f"gs://{BUCKET}/corpus/{{{{ ds }}}}/*.jsonl.zst"
# zarr keeps the group attributes in .zattrs (format 2) or zarr.json (format 3); the pipeline
# writes them last, when the whole dataset is in place (its commit).
ROOT_METADATA = (".zattrs", "zarr.json")


def _root_attributes(ds: str) -> dict | None:
    """The day's dataset's root attributes, or None when it has none (absent or unfinished)."""
    gcs = GCSHook()
    for name in ROOT_METADATA:
        obj = f"{OUTPUT_PREFIX}/{ds}.zarr/{name}"
        if gcs.exists(bucket_name=BUCKET, object_name=obj):
            doc = json.loads(gcs.download(bucket_name=BUCKET, object_name=obj))
            return doc.get("attributes", {}) if name == "zarr.json" else doc
    return None


def not_built_yet(ds: str, **_) -> bool:
    attrs = _root_attributes(ds)
    if attrs and attrs.get("complete") is True:
        print(f"gs://{BUCKET}/{OUTPUT_PREFIX}/{ds}.zarr is already committed; nothing to do")
        return False
    return True


def read_summary(ds: str, **_) -> dict:
    attrs = _root_attributes(ds)
    if not attrs or attrs.get("complete") is not True:
        raise RuntimeError(f"gs://{BUCKET}/{OUTPUT_PREFIX}/{ds}.zarr is not committed")
    stats = attrs["stats"]
    print(json.dumps(stats, indent=2))
    return {"output": f"gs://{BUCKET}/{OUTPUT_PREFIX}/{ds}.zarr", "stats": stats,
            "run_id": attrs.get("run_id"), "tokenizer": attrs.get("tokenizer")}


with DAG(
    dag_id="flat_tokens_daily",
    description="JSONL corpus of the day -> gs://BUCKET/flat-tokens/{{ ds }}.zarr (Dataflow Flex Template)",
    schedule="@daily",
    start_date=datetime(2024, 6, 1),
    catchup=False,
    # One day at a time: each build removes the texts of every committed day under the prefix
    # (dedup_against below); two days built at once could both keep a text new to both.
    max_active_runs=1,
    default_args={"retries": 2},  # a retry launches the same parameters: it resumes the failed job's output
    tags=["flat-tokens", "dataflow"],
) as dag:
    already_built = ShortCircuitOperator(task_id="already_built", python_callable=not_built_yet)

    build = DataflowStartFlexTemplateOperator(
        task_id="build",
        project_id=PROJECT,
        location=REGION,
        wait_until_finished=True,  # the task's state is the job's: DONE -> success
        append_job_name=False,     # jobName below already says which day
        body={
            "launchParameter": {
                "jobName": "flat-tokens-{{ ds_nodash }}",
                "containerSpecGcsPath": TEMPLATE,
                "parameters": {
                    "input": INPUT,
                    "output": OUTPUT,
                    "tokenizer": TOKENIZER,
                    "validation_fraction": "0.01",
                    "seed": "0",
                    "zarr_format": "2",
                    "codec": "zstd",
                    # Each text once across the dated datasets: removed when a committed day under
                    # the prefix holds it (days being built are skipped; the output itself too),
                    # reading only their dedup indexes (docs/dedup.md, "Across datasets").
                    "dedup": "exact",
                    "dedup_against": f"gs://{BUCKET}/{OUTPUT_PREFIX}/*.zarr",
                    # No "overwrite": an existing non-empty output makes the launch fail with
                    # exit 2 before any data is read, so a finished day is never replaced.
                    "sdk_container_image": IMAGE,
                },
                "environment": {
                    "tempLocation": f"gs://{BUCKET}/dataflow/temp",
                    "stagingLocation": f"gs://{BUCKET}/dataflow/staging",
                    "machineType": "n2-standard-4",
                    "maxWorkers": 32,
                    "additionalUserLabels": {"pipeline": "flat-tokens", "ds": "{{ ds_nodash }}"},
                },
            }
        },
        execution_timeout=timedelta(hours=12),
    )

    summary = PythonOperator(task_id="summary", python_callable=read_summary)

    already_built >> build >> summary
