#!/usr/bin/env bash
# Check the deployment files with the pinned tools of the `dev` extra (docs/deploy.md, "Checks"):
# docker-compose.yml against the compose-spec schema, the Dockerfile with hadolint, these scripts
# with ShellCheck, and every Kubernetes manifest and rendered overlay with kubernetes-validate --strict.
#   scripts/check-deploy.sh [BIN_DIR]      # BIN_DIR holds the tools (default .venv/bin)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-.venv/bin}
k8s_version=${K8S_VERSION:-1.33.0}  # the Kubernetes release the manifests must be valid for

"$bin/check-jsonschema" --builtin-schema vendor.compose-spec docker-compose.yml
"$bin/hadolint" Dockerfile docker/standin/*.Dockerfile
echo "Dockerfiles: hadolint clean"
"$bin/shellcheck" scripts/*.sh docker/standin/*.sh
echo "scripts: shellcheck clean"

# Patches are partial objects by design; they are checked inside the overlays that apply them.
mapfile -t manifests < <(find k8s -name '*.yaml' ! -name kustomization.yaml ! -path '*/patches/*' | sort)
"$bin/kubernetes-validate" --strict --quiet -k "$k8s_version" "${manifests[@]}"
echo "k8s: ${#manifests[@]} manifests valid for Kubernetes $k8s_version"
for overlay in k8s/overlays/*/; do
    "$bin/kubectl" kustomize "$overlay" | "$bin/kubernetes-validate" --strict --quiet -k "$k8s_version" -
    echo "k8s: overlay $overlay renders and is valid for Kubernetes $k8s_version"
done
