#!/usr/bin/env python3
"""Adapts the Kubernetes manifests of this directory for `podman kube play` on one machine.

    kube-play-adapt.py [--host-path FROM=TO]... MANIFEST > OUT.yaml

A DaemonSet becomes a Pod of its pod template, named after the DaemonSet (podman before 4.4
cannot play a DaemonSet; on one machine it is one pod anyway). --host-path rewrites hostPath
volumes whose path is FROM to TO, to try the manifests with other host directories. Everything
else is passed through unchanged; other kinds are copied as they are.
"""

import argparse
import sys

import yaml


def host_path_pair(text):
    old, sep, new = text.partition("=")
    if not sep or not old.startswith("/") or not new.startswith("/"):
        raise argparse.ArgumentTypeError(f"{text!r}: expected /FROM=/TO")
    return old, new


def as_pod(doc):
    """The Pod a DaemonSet runs on each node; any other document unchanged."""
    if doc.get("kind") != "DaemonSet":
        return doc
    template = doc["spec"]["template"]
    metadata = dict(template.get("metadata") or {})
    metadata["name"] = doc["metadata"]["name"]
    if "namespace" in doc["metadata"]:
        metadata["namespace"] = doc["metadata"]["namespace"]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": template["spec"]}


def rewrite_host_paths(pod, mapping):
    if pod.get("kind") != "Pod":
        return
    for volume in pod["spec"].get("volumes") or []:
        host = volume.get("hostPath")
        if host and host.get("path") in mapping:
            host["path"] = mapping[host["path"]]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host-path", action="append", default=[], type=host_path_pair,
                        metavar="FROM=TO", help="point hostPath volumes at FROM to TO")
    parser.add_argument("manifest")
    args = parser.parse_args()
    with open(args.manifest, encoding="utf-8") as f:
        docs = [d for d in yaml.safe_load_all(f) if d is not None]
    out = []
    for doc in docs:
        doc = as_pod(doc)
        rewrite_host_paths(doc, dict(args.host_path))
        out.append(doc)
    yaml.safe_dump_all(out, sys.stdout, sort_keys=False)


if __name__ == "__main__":
    main()
