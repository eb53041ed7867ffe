# The remapped-label runs of SmolLM2-135M (docs/findings.md): `evalm eval icl` itself, then
# `evalm eval tables runs/smollm23/*/results.json` renders their results.json (A+B+C pools runs split by seed).
G=$(python -c "from evalm.train.prepare import gguf_location as g; f, n = g(); print(f / n)")
python -c "from pathlib import Path; from evalm.icl_eval.tasks.folder import write_lead_task as w; \
print(w(Path('data/samples/tasks/bbc_news/task.toml'), 32))"    # data/samples/tasks/bbc_news-lead32: bodies cut to 32 words
COMMON="--hf-model $(dirname $G) --gguf-file $(basename $G) --methods incremental --eval.method.scoring=answer-sum \
  --eval.method.on_overflow=drop_left --eval.dtype=bfloat16 --seeds 1,2,3 --test-items 200"
RT=data/samples/tasks/rotten_tomatoes/task.toml; BBC=data/samples/tasks/bbc_news-lead32/task.toml
export OMP_NUM_THREADS=1    # one process per core: two side by side
for m in int symbols; do
  evalm eval icl $COMMON --task $RT --order-seeds 1,2 --shots 0,4,16,64,256 --label-map $m --out runs/smollm23/rt-$m-shots
  evalm eval icl $COMMON --task $BBC --order-seeds 1,2 --shots 0,4,16,64,256 --label-map $m --out runs/smollm23/bbc-$m-shots
done
for m in int symbols; do  # the same items, draws and orders by token budget
  evalm eval icl $COMMON --task $RT --order-seeds 1,2 --budgets 0,1024,2048,4096 --label-map $m --out runs/smollm23/rt-$m-budgets
  evalm eval icl $COMMON --task $BBC --order-seeds 1,2 --budgets 0,1024,2048,4096 --label-map $m --out runs/smollm23/bbc-$m-budgets
done
evalm eval icl $COMMON --task $RT --test-items 100 --budgets 0,2048 --label-map int --order random,label-sorted --nearest remove \
  --nearest-k 4 --out runs/smollm23/rt-int-diagnostics
for s in 1,2 3; do  # the same at 4,096 tokens, one process per seed group side by side (pooled by --tables A+B)
  evalm eval icl $COMMON --task $RT --test-items 100 --seeds $s --budgets 0,4096 --label-map int \
    --order random,label-sorted --nearest remove --nearest-k 4 --out runs/smollm23/rt-int-diagnostics4096-seed${s/,/} &
done; wait
for s in 1 2 3; do  # 4,096 tokens, order seed 1, 200 items: label-sorted and the three nearest modes
  evalm eval icl $COMMON --task $RT --seeds $s --order-seeds 1 --budgets 0,4096 --label-map int \
    --order random,label-sorted --nearest remove,keep,corrupt --nearest-k 4 --out runs/smollm23/rt-int-nearest4096-seed$s &
done; wait  # a process per draw, pooled by `evalm eval tables A+B+C`
evalm eval tables runs/smollm23/*-shots/results.json runs/smollm23/*-budgets/results.json \
  runs/smollm23/rt-int-diagnostics/results.json \
  runs/smollm23/rt-int-diagnostics4096-seed12/results.json+runs/smollm23/rt-int-diagnostics4096-seed3/results.json \
  runs/smollm23/rt-int-nearest4096-seed1/results.json+runs/smollm23/rt-int-nearest4096-seed2/results.json\
+runs/smollm23/rt-int-nearest4096-seed3/results.json
