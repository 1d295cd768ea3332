#!/usr/bin/env bash
# The doctor's cross-node sanity run (tests/image/cluster_sanity.py) on the GPU machine: two ranks as two
# processes, one GPU each when two are present (else both on GPU 0), Gloo then NCCL all-reduce. No vLLM there,
# so the message-queue stage reports itself skipped. Results: $OUT/rank{0,1}.jsonl, $OUT/env.txt.
# Recorded run (benchmarks/results/cluster-sanity-gpu/): the device tool runs a copy of the coordinator's
# checkout, so the script travelled as gzip+base64 chunks into build/cs.py (sha256 checked) and ran there with
# exactly these arguments: sanity --rank R --world 2 --master 127.0.0.1:PORT --nccl yes --local-rank R --timeout 90.
set -euo pipefail
out=${OUT:-/tmp/cluster-sanity}
mkdir -p "$out"
gpus=$(nvidia-smi -L | wc -l)
{ nvidia-smi -L; python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())'; } >"$out/env.txt" 2>&1
port=$((29500 + RANDOM % 1000))
start=$(date +%s.%N)
for rank in 0 1; do
  local_rank=$rank; [ "$gpus" -ge 2 ] || local_rank=0
  timeout 120 python3 tests/image/cluster_sanity.py sanity --rank $rank --world 2 --master 127.0.0.1:$port \
    --nccl yes --local-rank $local_rank --timeout 60 >"$out/rank$rank.jsonl" 2>"$out/rank$rank.err" &
done
wait
end=$(date +%s.%N)
echo "wall_s $(echo "$end - $start" | bc)" >>"$out/env.txt"
cat "$out"/rank*.jsonl "$out/env.txt"
