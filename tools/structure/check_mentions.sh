#!/usr/bin/env bash
# Every form of each property check's name, per file. Usage (repo root): bash tools/structure/check_mentions.sh
declare -A forms=(
  [determinism]="determinism|check_determinism|test_determinism|test_determinism_backward|deterministic|deterministic_directions"
  [batch_invariance]="batch_invariance|check_batch_invariance|test_batch_invariance|batch_invariant"
  [cuda_graph]="cuda_graph|check_cuda_graph|test_cuda_graph|supports_cuda_graphs|cuda_graphs"
  [torch_compile]="torch_compile|check_torch_compile|test_torch_compile|supports_torch_compile"
  [opcheck]="opcheck|check_opcheck|test_opcheck|custom_op")
for check in determinism batch_invariance cuda_graph torch_compile opcheck; do
  echo "== $check"
  grep -rowE "${forms[$check]}" pytest_attnkit suites --include='*.py' | cut -d: -f1 | sort | uniq -c
done
