#!/usr/bin/env python3
"""Adapts the Kubernetes manifests of this directory for `podman kube play` on one machine.

    kube-play-adapt.py [--host-path FROM=TO]... [--secret NAME=DIR]... [--env NAME=VALUE]...
                       [--host-network] MANIFEST > OUT.yaml

A DaemonSet becomes a Pod of its pod template, named after the DaemonSet (podman before 4.4
cannot play a DaemonSet; on one machine it is one pod anyway). The options change the pods:

  --host-path FROM=TO  hostPath volumes whose path is FROM point at TO instead, to try the
                       manifests with other host directories.
  --secret NAME=DIR    secret volumes of the Secret NAME become hostPath volumes of DIR, a
                       directory holding the Secret's keys as files, as the kubelet would
                       project them (podman before 4.4 has no Secrets).
  --env NAME=VALUE     every container (init containers too) gets the environment variable
                       NAME=VALUE, replacing one of that name.
  --host-network       the pods use the host's network (hostNetwork: true), to reach a
                       registry that listens on the host's loopback address.

Everything else is passed through unchanged; other kinds are copied as they are.
"""

import argparse
import sys

import yaml


def host_path_pair(text):
    old, sep, new = text.partition("=")
    if not sep or not old.startswith("/") or not new.startswith("/"):
        raise argparse.ArgumentTypeError(f"{text!r}: expected /FROM=/TO")
    return old, new


def name_value(text):
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=VALUE")
    return name, value


def secret_dir(text):
    name, sep, path = text.partition("=")
    if not sep or not name or not path.startswith("/"):
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=/DIR")
    return name, path


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


def rewrite_secrets(pod, mapping):
    if pod.get("kind") != "Pod":
        return
    for volume in pod["spec"].get("volumes") or []:
        secret = volume.get("secret")
        if secret and secret.get("secretName") in mapping:
            del volume["secret"]
            volume["hostPath"] = {"path": mapping[secret["secretName"]], "type": "Directory"}


def set_env(pod, pairs):
    if pod.get("kind") != "Pod":
        return
    spec = pod["spec"]
    for container in (spec.get("initContainers") or []) + (spec.get("containers") or []):
        env = container.setdefault("env", [])
        for name, value in pairs:
            same = [e for e in env if e.get("name") == name]
            if same:
                same[0].clear()
                same[0].update({"name": name, "value": value})
                env[:] = [e for e in env if e.get("name") != name or e is same[0]]
            else:
                env.append({"name": name, "value": value})


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host-path", action="append", default=[], type=host_path_pair,
                        metavar="FROM=TO", help="point hostPath volumes at FROM to TO")
    parser.add_argument("--secret", action="append", default=[], type=secret_dir,
                        metavar="NAME=DIR",
                        help="make secret volumes of the Secret NAME hostPath volumes of DIR")
    parser.add_argument("--env", action="append", default=[], type=name_value,
                        metavar="NAME=VALUE", help="set NAME=VALUE in every container")
    parser.add_argument("--host-network", action="store_true",
                        help="run the pods in the host's network (hostNetwork: true)")
    parser.add_argument("manifest")
    args = parser.parse_args()
    with open(args.manifest, encoding="utf-8") as f:
        docs = [d for d in yaml.safe_load_all(f) if d is not None]
    out = []
    for doc in docs:
        doc = as_pod(doc)
        rewrite_host_paths(doc, dict(args.host_path))
        rewrite_secrets(doc, dict(args.secret))
        set_env(doc, args.env)
        if args.host_network and doc.get("kind") == "Pod":
            doc["spec"]["hostNetwork"] = True
        out.append(doc)
    yaml.safe_dump_all(out, sys.stdout, sort_keys=False)


if __name__ == "__main__":
    main()
