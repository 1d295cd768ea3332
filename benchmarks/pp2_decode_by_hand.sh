#!/bin/bash
# The two ranks of tests/profiles/cpu-tiny-qwen35moe-conform-pp2.yaml started by hand on the namespaced twin nodes
# (the containers cluster.up starts, each node's extra docker-run options in EXTRA_A / EXTRA_B), then one greedy
# decode of 64 and one of 512 tokens asked from inside the head; benchmarks/conform.md, "Two nodes on one machine".
# usage: M=MODEL_DIR SA=unix://NODE_A_SOCKET SB=unix://NODE_B_SOCKET [IMG=...] EXTRA_A="..." EXTRA_B="..." \
#          benchmarks/pp2_decode_by_hand.sh LABEL
# (a held twin_nodes cluster: tests/engine/cluster_real_fixtures.py; the trained model: its cache directory)
set -u
: "${M:?the trained model directory}" "${SA:?node a engine}" "${SB:?node b engine}"
IMG=${IMG:-sparkforge-run-test/cpu-twin:vllm}
EXTRA_A=${EXTRA_A:-} EXTRA_B=${EXTRA_B:-}
mkdir -p /tmp/ccache/vllm
common() { echo --label dev.sparkforge.run=serve --network host --ipc host --ulimit nofile=16384 --cap-add IPC_LOCK --volume /tmp/ccache/vllm:/root/.cache/vllm --volume $M:/models:ro --env GLOO_SOCKET_IFNAME=fabric0 --env NCCL_SOCKET_IFNAME=fabric0 --env TP_SOCKET_IFNAME=fabric0 --env VLLM_CPU_KVCACHE_SPACE=1; }
ARGS="serve /models --pipeline-parallel-size 2 --max-model-len 4800 --max-num-seqs 8 --max-num-batched-tokens 1280 --compilation-config {\"mode\":2,\"backend\":\"eager\"} --dtype bfloat16 --tokenizer /models/tokenizer --limit-mm-per-prompt {\"image\":0,\"video\":0} --served-model-name tiny --nnodes 2 --master-addr 10.77.0.1 --master-port 29513"
docker -H $SA rm -f pa >/dev/null 2>&1; docker -H $SB rm -f pb >/dev/null 2>&1
t0=$(date +%s)
docker -H $SB run -d --name pb $(common) --env VLLM_HOST_IP=10.77.0.2 $EXTRA_B --entrypoint vllm $IMG $ARGS --node-rank 1 --headless >/dev/null
docker -H $SA run -d --name pa $(common) --env VLLM_HOST_IP=10.77.0.1 $EXTRA_A --entrypoint vllm $IMG $ARGS --node-rank 0 --host 0.0.0.0 --port 18473 >/dev/null
for i in $(seq 1 200); do
  docker -H $SA exec pa python3 -c "import urllib.request;urllib.request.urlopen('http://10.77.0.1:18473/health',timeout=2)" 2>/dev/null && break
  sleep 3
  if [ -z "$(docker -H $SA ps -q -f name=pa)" ] || [ -z "$(docker -H $SB ps -q -f name=pb)" ]; then echo DIED; docker -H $SA logs pa 2>&1 | tail -20; docker -H $SB logs pb 2>&1|tail -20; exit 1; fi
done
t1=$(date +%s); echo "$1: healthy after $((t1-t0)) s"
docker -H $SA exec -i pa python3 - <<'PY'
import json, time, urllib.request
def ask(n, prompt="3 4"):
    body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True}).encode()
    t = time.monotonic()
    r = json.load(urllib.request.urlopen(urllib.request.Request("http://10.77.0.1:18473/v1/completions", body, {"Content-Type": "application/json"}), timeout=3000))
    return time.monotonic() - t, r["usage"]["completion_tokens"], r["choices"][0]["text"][:60]
ask(8)
for n in (64, 512):
    dt, k, txt = ask(n)
    print(f"  {k} tokens in {dt:.2f} s = {k/dt:.1f} tok/s  {txt!r}")
PY
docker -H $SA logs pa 2>&1 | grep -A4 "OpenMP thread binding" | head -6
docker -H $SB logs pb 2>&1 | grep -A4 "OpenMP thread binding" | head -6
[ -n "${KEEP:-}" ] || { docker -H $SA rm -f pa >/dev/null; docker -H $SB rm -f pb >/dev/null; }
