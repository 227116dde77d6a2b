#!/bin/bash
# The merged tree on one H200 in one command: the GPU tests of the executor, graphs, prefix cache, sampler and
# DeltaNet; 32k prefill old (A) vs new (B) A B B A; bench offline prefill (batch-invariant on / off); decode
# A B B A; serve at concurrency 1 (greedy; top-p old vs new); the prefix cache under multi-turn load.
# Usage: scripts/gpu/session_check.sh DIR  (DIR holds new.tar.xz* = build-cuda/{moefold,lib.tar.xz,tests/*},
# old.tar.xz = an older moefold, require_b.txt = the --require-kernel words of B, tokenizer.json and
# tokenizer_config.json of the tokenizer the dummy 35B server uses)
R=$(cd ${1:?DIR}; pwd); ROOT=$(cd $(dirname $0)/../..; pwd); cd $ROOT
mkdir -p /tmp/new /tmp/old && cat $R/new.tar.xz* | tar xJ -C /tmp/new && tar xJf $R/old.tar.xz -C /tmp/old || exit 1
source scripts/gpu/env.sh /tmp/new/build-cuda || exit 1
export MOEFOLD_SOURCE_DIR=$ROOT
N=/tmp/new/build-cuda/moefold; O=/tmp/old/moefold; T=/tmp/new/build-cuda/tests; M=configs/qwen3.6-35b-a3b
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
echo "== 1. GPU tests (merged tree)"
for t in cuda_executor_test:35 cuda_graph_test:35 prefix_cache_cuda_test:25 sampling_test:30 token_bitmask_test:12 gated_delta_net_test:35; do
  n=${t%%:*}; s=${t#*:}; [ -x $T/$n ] || { echo "$n missing"; continue; }
  timeout $s $T/$n > /tmp/t_$n.log 2>&1; rc=$?
  echo "$n rc=$rc CONTRACT pass=$(grep -c 'verdict=PASS' /tmp/t_$n.log) fail=$(grep -c 'verdict=FAIL' /tmp/t_$n.log) | $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]+ test' /tmp/t_$n.log | tr '\n' ' ')"
  grep -E '^\[  FAILED  \] [A-Z]' /tmp/t_$n.log | head -8
done
echo "== 2. prefill 32k, old (A) vs new (B), A B B A"
pf() { timeout 60 $1 profile --model $M --load-format dummy --device cuda --workload prefill:32768 $2 > /tmp/pf_$3.txt 2>&1; echo "run $3 rc=$? $(grep -m1 'profiled wall' /tmp/pf_$3.txt | cut -c1-60)"; grep -E "^(attention prefill|DeltaNet|routed-expert GEMM|dense GEMM|conv) " /tmp/pf_$3.txt | head -5; grep -iE "error|require" /tmp/pf_$3.txt | head -2; }
RA="--require-kernel attn_wgmma_kernel --require-kernel gdn_prefill_tc_kernel"; RB="$(cat $R/require_b.txt)"
pf $O "$RA" 1; pf $N "$RB" 2; pf $N "$RB" 3; pf $O "$RA" 4
grep -E "^[a-z_:0-9]+ +(attention prefill|DeltaNet|conv) " /tmp/pf_2.txt | head -8
echo "== 2b. bench offline prefill 32768 (median of 2): old default, new default (batch-invariant), new --no-batch-invariant"
bo() { timeout 60 $1 bench offline --model $M --load-format dummy --prefill 32768 --repeats 2 --decode-batch 1 --decode-steps 4 $2 > /tmp/bo_$3.txt 2>&1; echo "$3 rc=$? $(grep -E '^prefill' /tmp/bo_$3.txt | head -2 | tr '\n' ' ')"; grep -iE "error" /tmp/bo_$3.txt | head -2; }
bo $O "" old; bo $N "" new_inv; bo $N --no-batch-invariant new_noinv
echo "== 3. decode, old (A) vs new (B), both graphs, A B B A"
A_BIN=$O A_FLAGS= timeout 150 scripts/gpu/decode_ab.sh $N $M /tmp/ab --load-format dummy --decode-batch 1,8,64,256 --decode-steps 16 > /tmp/ab.log 2>&1; echo "decode_ab rc=$?"; grep -iE "error" /tmp/ab.log | head -3; tail -6 /tmp/ab.log
echo "== 4. serve, concurrency 1, 1024 in / 256 out, 6 requests"
SD=/tmp/sd35; mkdir -p $SD; cp $M/*.json $SD/; cp $R/tokenizer.json $R/tokenizer_config.json $SD/
SA="--device cuda --load-format dummy --max-num-seqs 64 --max-num-batched-tokens 8192 --kv-cache-memory 24G --max-model-len 4096"
sb() { SERVE_ARGS="$SA" timeout 90 scripts/gpu/serve_bench.sh $1 $SD /tmp/sb_$2 --tokenizer $SD --random-prompt-format token-ids --ignore-eos --dataset-name random --random-input-len 1024 --random-output-len 256 --num-prompts 6 --max-concurrency 1 $3 > /tmp/sb_$2.log 2>&1; echo "serve $2 rc=$?"; grep -iE "output token throughput|median tpot|median ttft|error" /tmp/sb_$2.log | head -4; }
sb $N greedy_new ""
sb $O topp_old "--temperature 0.7 --extra-body {\"top_p\":0.9,\"seed\":1}"
sb $N topp_new "--temperature 0.7 --extra-body {\"top_p\":0.9,\"seed\":1}"
echo "== 5. prefix cache multi-turn, cache on/off A B B A"
BENCH_ARGS="--dataset-name multi_turn --num-prompts 16 --multi-turn-num-turns 4 --multi-turn-shared-prefix-len 2048 --multi-turn-prefix-len 512 --multi-turn-user-len 256 --output-len 64 --ignore-eos --max-concurrency 8 --seed 7" timeout 110 bash scripts/gpu/prefix_multiturn_ab.sh $N $SD /tmp/mt > /tmp/mt.log 2>&1; echo "multiturn rc=$?"; tail -12 /tmp/mt.log
cp /tmp/pf_2.txt /tmp/ab.log $OUT/ 2>/dev/null; tar cJf $OUT/logs.tar.xz /tmp/t_*.log /tmp/pf_*.txt /tmp/ab /tmp/sb_* /tmp/mt.log 2>/dev/null; date -u
