# The flags of the reference's GLM-4.5 model page, transcribed (not copied code: the flag lists the page shows):
#   radixark/miles docs/models/glm/glm4-5.md @ 04c43cc83790e4abbd97d0494cfca133cc7d6bba
# Read by tests/config/test_reference_import.py with `miles recipe import --base glm4-5 --from-file`.

# §3.3: the model arguments of the named spec
MODEL_ARGS_LINE="$(python3 scripts/model_args.py glm4.5-355B-A32B)" || exit 1
read -ra MODEL_ARGS <<< "${MODEL_ARGS_LINE}"
${MODEL_ARGS[@]}

# §5.1 Parallelism, the row of run_glm45_355b_a32b_8node.py: TP 8, PP 4, CP 2, EP 16, expert-TP 1, max_tokens_per_gpu 16384,
# 64 GPUs (8 x 8)
--tensor-model-parallel-size 8 \
--pipeline-model-parallel-size 4 \
--context-parallel-size 2 \
--expert-model-parallel-size 16 \
--expert-tensor-parallel-size 1 \
--max-tokens-per-gpu 16384 \
--actor-num-nodes 8 \
--actor-num-gpus-per-node 8

# §5.2 Algorithm, the row of run_glm45_355b_a32b_8node.py: GSPO
--advantage-estimator gspo --eps-clip 1e-4 --eps-clip-high 2e-4 --use-tis

# §5.3 Rollout & SGLang
--rollout-num-gpus-per-engine 32
--sglang-mem-fraction-static 0.7
--sglang-enable-dp-attention
--sglang-dp-size 4
--sglang-ep-size 32
--sglang-enable-dp-lm-head
--sglang-moe-dense-tp-size 1

# mtp / EAGLE
--sglang-speculative-algorithm EAGLE
--sglang-speculative-num-steps 1
--sglang-speculative-eagle-topk 1
--sglang-speculative-num-draft-tokens 2
--sglang-enable-draft-weights-cpu-backup

# "Megatron side"
--moe-token-dispatcher-type flex
--moe-enable-deepep

# §5.4 Optimizer: CPU Adam on
--optimizer-cpu-offload
--overlap-cpu-optimizer-d2h-h2d
--use-precision-aware-optimizer
