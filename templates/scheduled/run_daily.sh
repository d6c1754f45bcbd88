#!/usr/bin/env bash
# Build one dated dataset with `python -m pipeline.run` on any runner that runs the pipeline to
# completion in this process (DirectRunner, PortableRunner, Flink through its job server), and
# turn the outcome into what a scheduler needs (cron, Airflow BashOperator, a Kubernetes or
# Cloud Run job):
#
#   run_daily.sh OUTPUT [pipeline.run options...]
#   e.g. run_daily.sh gs://my-bucket/flat-tokens/2024-06-01.zarr \
#            --input 'gs://my-bucket/corpus/2024-06-01/*.jsonl.zst' --tokenizer gs://my-bucket/tok.json
#
# Never passes --overwrite (refuses it too): an existing non-empty OUTPUT is never replaced.
#
# Exit status and the last line of stdout (Airflow's BashOperator pushes that line to XCom):
#   0  built now: the last line is the --summary_json document (stats, wall_seconds,
#      tokens_per_second, run_id, tokenizer) on one line
#   0  already built, nothing rewritten: by this very command over the same input (pipeline.run
#      itself says so and exits 0: the last line is its summary, with "already_built": true), or
#      by other options (OUTPUT exists and `python -m flat_tokens.tools.verify` accepts it): the last
#      line is {"output": ..., "already_built": true}
#   1  the pipeline failed: OUTPUT is left uncommitted (verify rejects it), with the work it
#      finished kept under it. Rerunning this script with the same options resumes it; after a
#      fix that changes the input or the options, rerun pipeline.run with --overwrite by hand.
#   2  a usage or configuration error found before any data was read, including an OUTPUT that
#      exists but is neither a committed dataset nor resumable with these options (e.g. left by a
#      failed run with other options): do not retry blindly.
#
# Across days: with --dedup exact or near and no --dedup_against of its own, the build is
# deduplicated against every earlier date under the same prefix (OUTPUT's committed siblings
# named YYYY-MM-DD with the same suffix and an earlier date: `python -m pipeline.earlier
# OUTPUT` lists them), so the dated datasets together hold each text once, in the split of
# the day that first held it (docs/dedup.md, "Across datasets"). DEDUP_AGAINST_EARLIER=0
# turns that off.
#
# PYTHON (default: python) is the interpreter that has this package installed.
set -uo pipefail

PYTHON=${PYTHON:-python}
if [[ $# -lt 1 || $1 == -* ]]; then
    echo "usage: $0 OUTPUT [pipeline.run options...]" >&2
    exit 2
fi
OUTPUT=$1
shift
dedup=none
against=0
previous=
for arg in "$@"; do
    [[ $previous == --dedup ]] && dedup=$arg
    previous=$arg
    case $arg in
        --dedup=*) dedup=${arg#--dedup=} ;;
        --dedup_against|--dedup_against=*) against=1 ;;
        --overwrite|--overwrite=*) echo "run_daily.sh: --overwrite is not allowed here: a scheduled run never replaces a dataset" >&2; exit 2 ;;
        --output|--output=*|--summary_json|--summary_json=*) echo "run_daily.sh: $arg is set by this script" >&2; exit 2 ;;
    esac
done

EARLIER=()
if [[ ${DEDUP_AGAINST_EARLIER:-1} != 0 && $against == 0 && ( $dedup == exact || $dedup == near ) ]]; then
    listed=$("$PYTHON" -m pipeline.earlier "$OUTPUT") || exit 2
    [[ -n $listed ]] && mapfile -t EARLIER <<< "$listed"
fi

SUMMARY=$(mktemp "${TMPDIR:-/tmp}/flat-tokens-summary.XXXXXX.json")
trap 'rm -f "$SUMMARY"' EXIT

"$PYTHON" -m pipeline.run --output "$OUTPUT" --summary_json "$SUMMARY" "$@" "${EARLIER[@]}"
rc=$?
case $rc in
    0)
        "$PYTHON" -c 'import json, sys; print(json.dumps(json.load(open(sys.argv[1])), separators=(",", ":")))' "$SUMMARY"
        exit 0 ;;
    2)
        # The refusal (or another usage error). A committed dataset at OUTPUT means this day is done.
        if "$PYTHON" -m flat_tokens.tools.verify "$OUTPUT" >&2; then
            "$PYTHON" -c 'import json, sys; print(json.dumps({"output": sys.argv[1], "already_built": True}))' "$OUTPUT"
            exit 0
        fi
        exit 2 ;;
    *)
        exit "$rc" ;;
esac
