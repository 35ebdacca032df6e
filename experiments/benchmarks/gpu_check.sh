#!/usr/bin/env bash
# A short device check (<= 5 minutes on a CUDA machine), one JSON line per part:
#   1. bench_train at paper scale (paper supernet, batch 64), bf16 autocast off and on
#   2. two FEAST rounds of the paper config on synthetic CIFAR-100-shaped data, client-resources-num-gpus=0.25
#   3. kvtranslate translate-vs-prefill on CUDA
# Without CUDA it runs the same parts at tiny sizes on the CPU and prints a "skipped" line for each CUDA-only part.
#
#   bash experiments/benchmarks/gpu_check.sh            # from the repository root, with the project installed
set -uo pipefail
cd "$(dirname "$0")/../.."
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
PY=${PYTHON:-python}
status=0

if $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    cuda=1
    $PY -c "import json, torch; print(json.dumps({'part': 'device', 'cuda': True, 'name': torch.cuda.get_device_name(0), 'torch': torch.__version__}))"
else
    cuda=0
    echo '{"part": "device", "cuda": false, "note": "no CUDA device: CPU at tiny sizes; CUDA-only parts are skipped"}'
fi

# run PART CMD...: the command's last stdout line (a JSON object) gets a "part" key; a failure prints an error line
run() {
    local part=$1; shift
    local out
    if out=$(timeout "${PART_TIMEOUT:-240}" "$@" 2>/tmp/gpu_check_$$.err); then
        echo "$out" | tail -n 1 | $PY -c "import json, sys; r = json.loads(sys.stdin.read()); print(json.dumps({'part': '$part', **r}))"
    else
        status=1
        $PY -c "import json, sys; print(json.dumps({'part': '$part', 'error': sys.argv[1][-1500:]}))" "$(cat /tmp/gpu_check_$$.err)"
    fi
    rm -f /tmp/gpu_check_$$.err
}

skip() {
    echo "{\"part\": \"$1\", \"skipped\": \"$2\"}"
}

if [ $cuda = 1 ]; then
    run train_fp32 $PY -m experiments.benchmarks.bench_train --supernet paper --batch 64 --device cuda --steps 5 --repeats 3 --skip-fedtopo --skip-plain
    run train_bf16 $PY -m experiments.benchmarks.bench_train --supernet paper --batch 64 --device cuda --steps 5 --repeats 3 --skip-fedtopo --skip-plain --bf16
    $PY -m experiments.benchmarks.gpu_check_feast --clients 4 --num-cpus 2 --num-gpus 0.25 || status=1
    for script in experiments/translation/bench_translate.py experiments/translation/gpu_check_kvtranslate.py; do
        if [ ! -f "$script" ]; then
            skip "kvtranslate:$script" "$script does not exist in this tree"
            continue
        fi
        extra=""
        [ "$script" = experiments/translation/bench_translate.py ] && extra="--device cuda"
        run "kvtranslate:$(basename "$script" .py)" $PY "$script" $extra
    done
else
    # CPU, tiny: the smallest budget only, a few steps, one thread
    export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
    levels=$($PY -c "from experiments.benchmarks.bench_train import default_levels; print(default_levels('cpu', 8)[0])")
    run train_fp32 $PY -m experiments.benchmarks.bench_train --supernet cpu --batch 8 --steps 2 --repeats 1 --levels "$levels" --skip-fedtopo
    run train_bf16 $PY -m experiments.benchmarks.bench_train --supernet cpu --batch 8 --steps 2 --repeats 1 --levels "$levels" --skip-fedtopo --bf16
    skip train_paper_scale "CUDA only: the paper supernet at batch 64 takes minutes per step on a CPU"
    $PY -m experiments.benchmarks.gpu_check_feast --tiny --clients 2 --num-cpus 1 --num-gpus 0 || status=1
    skip kvtranslate "CUDA only: translate-vs-prefill on CUDA (experiments/translation/bench_translate.py --device cuda)"
fi
exit $status
