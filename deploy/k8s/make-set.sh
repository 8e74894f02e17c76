#!/usr/bin/env bash
# Prints the manifests of set N, made from set 0's (deploy/k8s/set0) by renaming every object
# seqsvr-set0-… to seqsvr-set<N>-… and setting the set id and labels to N:
#
#   deploy/k8s/make-set.sh 1 > set1.yaml && kubectl apply -f set1.yaml
#
# Set N's ConfigMap starts with claim-empty "1 2 3" and bootstrap-id "1" like set 0's: its own
# group is new. Clear them once it has formed (deploy/k8s/README.md).
set -euo pipefail
N=${1:-}
case "$N" in
  [1-9] | [1-9][0-9]) ;;
  *) echo "usage: $0 SET_ID   (1..99; set 0 is deploy/k8s/set0)" >&2; exit 2 ;;
esac
dir="$(dirname "$0")/set0"
for f in config.yaml storesvr.yaml allocsvr.yaml; do
  echo "---"
  sed -e "s/seqsvr-set0/seqsvr-set$N/g" \
    -e "s/seqsvr\.dev\/set: \"0\"/seqsvr.dev\/set: \"$N\"/" \
    -e "s/^  set-id: \"0\"/  set-id: \"$N\"/" \
    -e "s/^# Set 0's/# Set $N's/" \
    -e "s/Set 0 starts owning every uid and keeps the cluster map\./Sets other than 0 start empty and get uids by moves./" \
    "$dir/$f"
done
