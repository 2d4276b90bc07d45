//! Syntax and wiring of the deployment files: the Dockerfile (a small parser: known
//! instructions, continuations, stages, JSON forms, COPY sources that exist), the Kubernetes
//! manifests (a YAML parser, then the fields that make propagation work), the systemd unit, and
//! the fstab example through systemd's own generator where it is installed.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use super::{must, repo};

/// One Dockerfile instruction: keyword (upper case), arguments, line of its start.
#[derive(Debug)]
struct Instruction {
    keyword: String,
    args: String,
    line: usize,
}

const KNOWN: &[&str] = &[
    "FROM",
    "RUN",
    "CMD",
    "LABEL",
    "EXPOSE",
    "ENV",
    "ADD",
    "COPY",
    "ENTRYPOINT",
    "VOLUME",
    "USER",
    "WORKDIR",
    "ARG",
    "ONBUILD",
    "STOPSIGNAL",
    "HEALTHCHECK",
    "SHELL",
];

/// Joins `\` continuations, drops comments and blank lines, splits keyword and arguments.
fn parse_dockerfile(text: &str) -> Result<Vec<Instruction>, String> {
    let mut out = Vec::new();
    let mut pending: Option<(usize, String)> = None;
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.starts_with('#') || (line.is_empty() && pending.is_none()) {
            continue;
        }
        let (start, mut acc) = pending.take().unwrap_or((i + 1, String::new()));
        let (body, continues) = match line.strip_suffix('\\') {
            Some(b) => (b.trim_end(), true),
            None => (line, false),
        };
        if !acc.is_empty() {
            acc.push(' ');
        }
        acc.push_str(body);
        if continues {
            pending = Some((start, acc));
            continue;
        }
        let (kw, args) = acc.split_once(char::is_whitespace).unwrap_or((&acc, ""));
        let keyword = kw.to_ascii_uppercase();
        if !KNOWN.contains(&keyword.as_str()) {
            return Err(format!("line {start}: unknown instruction {kw}"));
        }
        if args.trim().is_empty() {
            return Err(format!("line {start}: {keyword} without arguments"));
        }
        out.push(Instruction {
            keyword,
            args: args.trim().to_owned(),
            line: start,
        });
    }
    if let Some((start, _)) = pending {
        return Err(format!("line {start}: continuation runs off the end"));
    }
    Ok(out)
}

#[test]
fn dockerfile_parser_rejects_what_docker_rejects() {
    assert!(
        parse_dockerfile("FROM x\nRUNN y\n")
            .unwrap_err()
            .contains("unknown instruction RUNN")
    );
    assert!(
        parse_dockerfile("FROM x\nRUN a \\\n")
            .unwrap_err()
            .contains("continuation")
    );
    assert!(
        parse_dockerfile("FROM x\nCOPY\n")
            .unwrap_err()
            .contains("without arguments")
    );
    let ok = parse_dockerfile("# c\nFROM x AS b\nRUN a \\\n  && b\n\nCMD [\"x\"]\n").unwrap();
    assert_eq!(ok.len(), 3);
    assert_eq!(ok[1].args, "a && b");
    assert_eq!(ok[2].line, 6);
}

#[test]
fn dockerfile_builds_from_files_in_the_repository() {
    let text = std::fs::read_to_string(repo().join("Dockerfile")).unwrap();
    let ins = parse_dockerfile(&text).unwrap();
    // Only ARGs may precede the first FROM.
    let first_from = ins
        .iter()
        .position(|i| i.keyword == "FROM")
        .expect("a FROM");
    assert!(ins[..first_from].iter().all(|i| i.keyword == "ARG"));
    let args: Vec<&str> = ins[..first_from]
        .iter()
        .map(|i| i.args.split('=').next().unwrap())
        .collect();
    assert_eq!(args, ["RUST_VERSION", "DEBIAN_RELEASE", "BUILD"]);
    // The Rust image is at least the crate's rust-version.
    let cargo = std::fs::read_to_string(repo().join("Cargo.toml")).unwrap();
    let rust_version = cargo
        .lines()
        .find_map(|l| l.strip_prefix("rust-version = "))
        .unwrap();
    assert!(text.contains(&format!(
        "ARG RUST_VERSION={}\n",
        rust_version.trim_matches('"')
    )));

    let mut stages: Vec<String> = Vec::new();
    for i in &ins {
        match i.keyword.as_str() {
            "FROM" => {
                let words: Vec<&str> = i.args.split_whitespace().collect();
                match words.as_slice() {
                    [_, as_, name] if as_.eq_ignore_ascii_case("as") => {
                        stages.push((*name).to_owned())
                    }
                    [_] => stages.push(String::new()),
                    _ => panic!("line {}: FROM {}", i.line, i.args),
                }
            }
            "COPY" | "ADD" => {
                let words: Vec<&str> = i.args.split_whitespace().collect();
                if let Some(from) = words[0].strip_prefix("--from=") {
                    assert!(
                        stages[..stages.len() - 1].iter().any(|s| s == from),
                        "line {}: no earlier stage {from}",
                        i.line
                    );
                    continue;
                }
                assert!(
                    words.len() >= 2,
                    "line {}: COPY needs sources and a destination",
                    i.line
                );
                for src in &words[..words.len() - 1] {
                    // Only the host-build stage takes files from target/, and only what
                    // scripts/install.sh staged there before the build (.dockerignore keeps
                    // out the rest).
                    if src.starts_with("target") {
                        assert!(
                            stages.last().map(String::as_str) == Some("build-host")
                                && *src == "target/container-staging/",
                            "line {}: never copy target/ but the staged install",
                            i.line
                        );
                        continue;
                    }
                    assert!(
                        repo().join(src).exists(),
                        "line {}: {src} is not in the repository",
                        i.line
                    );
                }
            }
            "ENTRYPOINT" | "CMD" => {
                let v: serde_json::Value = serde_json::from_str(&i.args).unwrap_or_else(|e| {
                    panic!("line {}: {} must be a JSON array: {e}", i.line, i.keyword)
                });
                let arr = v.as_array().unwrap();
                assert!(
                    !arr.is_empty() && arr.iter().all(|x| x.is_string()),
                    "line {}",
                    i.line
                );
            }
            _ => {}
        }
    }
    assert_eq!(stages, ["build-source", "build-host", "build", "runtime"]);
    assert!(
        ins.iter()
            .any(|i| i.keyword == "FROM" && i.args == "build-${BUILD} AS build")
    );
    let ignore = std::fs::read_to_string(repo().join(".dockerignore")).unwrap();
    let ignore: Vec<&str> = ignore.lines().collect();
    let target = ignore
        .iter()
        .position(|l| *l == "target")
        .expect("target ignored");
    let staged = ignore
        .iter()
        .position(|l| *l == "!target/container-staging")
        .expect("the staged install let through");
    assert!(target < staged, "the exception must follow the exclusion");
    // The [[bench]] targets Cargo.toml names explicitly must exist in the build stage.
    assert!(
        ins.iter()
            .any(|i| i.keyword == "COPY" && i.args == "benches ./benches")
    );
    let entry = ins.iter().find(|i| i.keyword == "ENTRYPOINT").unwrap();
    assert_eq!(
        entry.args,
        "[\"/usr/local/bin/kpack-container-entrypoint\"]"
    );
    assert!(ins.iter().any(|i| i.keyword == "COPY"
        && i.args
            == "mount-helpers/container-entrypoint.sh /usr/local/bin/kpack-container-entrypoint"));
    // The documented run line and the entrypoint agree on the device and capability.
    let deploy = std::fs::read_to_string(repo().join("docs/deploy.md")).unwrap();
    assert!(
        deploy.contains("docker run --rm --device /dev/fuse --cap-add SYS_ADMIN"),
        "docs/deploy.md"
    );
}

/// Parses every YAML document of the manifests with PyYAML and returns them as JSON.
fn yaml_documents(path: &Path) -> Vec<serde_json::Value> {
    let script = "import json, sys, yaml\n\
                  docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d is not None]\n\
                  print(json.dumps(docs))\n";
    let out = must(Command::new("python3").args(["-c", script]).arg(path));
    serde_json::from_str::<Vec<serde_json::Value>>(&out).unwrap()
}

#[test]
fn yaml_parser_refuses_broken_yaml() {
    let d = tempfile::tempdir().unwrap();
    let bad = d.path().join("bad.yaml");
    std::fs::write(&bad, "a: [1, 2\nb: c\n").unwrap();
    let r = super::run_for(
        Command::new("python3")
            .args([
                "-c",
                "import sys, yaml; list(yaml.safe_load_all(open(sys.argv[1])))",
            ])
            .arg(&bad),
        60,
    );
    assert_eq!(r.code, Some(1), "{}", r.stderr);
    assert!(r.stderr.contains("yaml.parser.ParserError"), "{}", r.stderr);
}

fn by_name<'a>(list: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    list.as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == name)
        .unwrap_or_else(|| panic!("no {name} in {list}"))
}

#[test]
fn kubernetes_daemonset_shares_the_mount_with_bidirectional_propagation() {
    let dir = repo().join("mount-helpers/kubernetes");
    let ds = yaml_documents(&dir.join("kpack-daemonset.yaml"));
    assert_eq!(ds.len(), 1);
    let ds = &ds[0];
    assert_eq!(ds["apiVersion"], "apps/v1");
    assert_eq!(ds["kind"], "DaemonSet");
    assert_eq!(
        ds["spec"]["selector"]["matchLabels"],
        ds["spec"]["template"]["metadata"]["labels"]
    );
    let spec = &ds["spec"]["template"]["spec"];
    let c = &spec["containers"][0];
    assert_eq!(
        c["securityContext"]["privileged"], true,
        "Bidirectional needs privileged"
    );
    let shared = by_name(&c["volumeMounts"], "shared");
    assert_eq!(shared["mountPropagation"], "Bidirectional");
    assert_eq!(shared["mountPath"], "/var/lib/kpack");
    let env = env_of(c);
    assert_eq!(env["KPACK_MOUNTPOINT"], "/var/lib/kpack/mnt");
    assert_eq!(env["KPACK_SOURCE"], "/packs/kernels.kpack");
    assert_eq!(env["KPACK_MOUNT_OPTIONS"], "ro,allow_other");
    assert_eq!(
        by_name(&spec["volumes"], "shared")["hostPath"]["path"],
        "/var/lib/kpack"
    );
    assert_eq!(
        by_name(&spec["volumes"], "packs")["hostPath"]["path"],
        "/opt/rocm/lib"
    );
    assert_eq!(by_name(&c["volumeMounts"], "packs")["mountPath"], "/packs");
    assert_eq!(
        by_name(&spec["volumes"], "fuse")["hostPath"]["type"],
        "CharDevice"
    );

    let pod = yaml_documents(&dir.join("kpack-consumer-pod.yaml"));
    assert_eq!(pod.len(), 1);
    let pod = &pod[0];
    assert_eq!(
        (pod["apiVersion"].as_str(), pod["kind"].as_str()),
        (Some("v1"), Some("Pod"))
    );
    let pspec = &pod["spec"];
    assert_eq!(
        by_name(&pspec["volumes"], "kpack")["hostPath"]["path"],
        "/var/lib/kpack"
    );
    for c in pspec["initContainers"]
        .as_array()
        .unwrap()
        .iter()
        .chain(pspec["containers"].as_array().unwrap())
    {
        let m = by_name(&c["volumeMounts"], "kpack");
        assert_eq!(m["mountPropagation"], "HostToContainer", "{}", c["name"]);
        assert_eq!(m["readOnly"], true);
        assert_eq!(m["mountPath"], "/kpack");
        assert!(
            c["securityContext"]["privileged"].is_null(),
            "consumers need no privilege"
        );
    }
}

fn env_of(container: &serde_json::Value) -> BTreeMap<String, String> {
    container["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_owned(),
                e["value"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[test]
fn kubernetes_oci_daemonset_mounts_the_nodes_gpus_with_the_secrets_credentials() {
    let dir = repo().join("mount-helpers/kubernetes");
    let ds = yaml_documents(&dir.join("kpack-oci-daemonset.yaml"));
    assert_eq!(ds.len(), 1);
    let ds = &ds[0];
    assert_eq!(ds["kind"], "DaemonSet");
    assert_eq!(
        ds["spec"]["selector"]["matchLabels"],
        ds["spec"]["template"]["metadata"]["labels"]
    );
    let spec = &ds["spec"]["template"]["spec"];
    assert!(
        spec["hostNetwork"].is_null(),
        "the pod network reaches a registry"
    );
    let c = &spec["containers"][0];
    assert_eq!(c["securityContext"]["privileged"], true);
    let env = env_of(c);
    assert!(env["KPACK_SOURCE"].starts_with("oci://"), "{env:?}");
    assert_eq!(env["KPACK_MOUNT_OPTIONS"], "ro,allow_other,gpu=auto");
    assert_eq!(env["KPACK_MOUNTPOINT"], "/var/lib/kpack/mnt");
    // The credentials: the .dockerconfigjson key of an optional dockerconfigjson Secret.
    let auth = by_name(&c["volumeMounts"], "registry-auth");
    assert_eq!(
        env["REGISTRY_AUTH_FILE"],
        format!("{}/.dockerconfigjson", auth["mountPath"].as_str().unwrap())
    );
    assert_eq!(auth["readOnly"], true);
    let secret = &by_name(&spec["volumes"], "registry-auth")["secret"];
    assert_eq!(secret["secretName"], "kpack-registry");
    assert_eq!(secret["optional"], true);
    // The rest as in kpack-daemonset.yaml.
    let plain_ds = yaml_documents(&dir.join("kpack-daemonset.yaml"));
    let plain = &plain_ds[0]["spec"]["template"]["spec"];
    let pc = &plain["containers"][0];
    for key in [
        "readinessProbe",
        "livenessProbe",
        "args",
        "image",
        "resources",
    ] {
        assert_eq!(c[key], pc[key], "{key}");
    }
    for name in ["shared", "fuse"] {
        assert_eq!(
            by_name(&c["volumeMounts"], name),
            by_name(&pc["volumeMounts"], name)
        );
        assert_eq!(
            by_name(&spec["volumes"], name),
            by_name(&plain["volumes"], name)
        );
    }
}

#[test]
fn kube_play_adapt_sets_env_secrets_and_the_host_network() {
    let dir = repo().join("mount-helpers/kubernetes");
    let d = tempfile::tempdir().unwrap();
    let out = must(
        Command::new("python3")
            .arg(dir.join("kube-play-adapt.py"))
            .arg(dir.join("kpack-oci-daemonset.yaml"))
            .args([
                "--secret",
                "kpack-registry=/tmp/auth",
                "--env",
                "KPACK_SOURCE=oci://127.0.0.1:5000/kpack/x:1",
                "--env",
                "EXTRA=a=b",
                "--host-network",
                "--host-path",
                "/var/lib/kpack=/tmp/share",
            ]),
    );
    let adapted = d.path().join("pod.yaml");
    std::fs::write(&adapted, out).unwrap();
    let pod = yaml_documents(&adapted);
    assert_eq!(pod.len(), 1);
    let pod = &pod[0];
    assert_eq!(pod["kind"], "Pod");
    assert_eq!(pod["metadata"]["name"], "kpack-fuse-oci");
    let spec = &pod["spec"];
    assert_eq!(spec["hostNetwork"], true);
    let c = &spec["containers"][0];
    let names: Vec<&str> = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "KPACK_SOURCE",
            "KPACK_MOUNTPOINT",
            "KPACK_MOUNT_OPTIONS",
            "REGISTRY_AUTH_FILE",
            "EXTRA"
        ],
        "replaced in place, added at the end"
    );
    let env = env_of(c);
    assert_eq!(env["KPACK_SOURCE"], "oci://127.0.0.1:5000/kpack/x:1");
    assert_eq!(env["EXTRA"], "a=b");
    assert_eq!(env["KPACK_MOUNT_OPTIONS"], "ro,allow_other,gpu=auto");
    let auth = by_name(&spec["volumes"], "registry-auth");
    assert!(auth["secret"].is_null());
    assert_eq!(auth["hostPath"]["path"], "/tmp/auth");
    assert_eq!(auth["hostPath"]["type"], "Directory");
    assert_eq!(
        by_name(&spec["volumes"], "shared")["hostPath"]["path"],
        "/tmp/share"
    );
}

/// `systemd-escape --path --suffix=mount` for plain paths (letters, digits, `/`, `-`, `_`).
fn unit_name_for(path: &str) -> String {
    let trimmed = path.trim_matches('/');
    let mut s = String::new();
    for c in trimmed.chars() {
        match c {
            '/' => s.push('-'),
            '-' => s.push_str("\\x2d"),
            c if c.is_ascii_alphanumeric() || c == '_' => s.push(c),
            c => panic!("unit_name_for handles plain paths only ({c:?})"),
        }
    }
    s + ".mount"
}

/// `[Section] Key=Value` lines of a unit file.
fn unit_keys(text: &str) -> BTreeMap<(String, String), String> {
    let mut section = String::new();
    let mut out = BTreeMap::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(s) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = s.to_owned();
            continue;
        }
        let (k, v) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("not Key=Value: {line}"));
        out.insert((section.clone(), k.to_owned()), v.to_owned());
    }
    out
}

#[test]
fn systemd_mount_unit_is_named_after_its_mount_point() {
    let dir = repo().join("mount-helpers/systemd");
    let units: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(units.len(), 1, "{units:?}");
    let unit = &units[0];
    let keys = unit_keys(&std::fs::read_to_string(unit).unwrap());
    let get = |s: &str, k: &str| {
        keys.get(&(s.to_owned(), k.to_owned()))
            .cloned()
            .unwrap_or_default()
    };
    assert_eq!(
        unit.file_name().unwrap().to_str().unwrap(),
        unit_name_for(&get("Mount", "Where"))
    );
    assert_eq!(get("Mount", "Type"), "fuse.kpack-fuse");
    assert_eq!(get("Mount", "What"), "/opt/rocm/lib/kernels.kpack");
    assert_eq!(get("Mount", "Options"), "ro,nodev,nosuid,allow_other");
    assert_eq!(get("Install", "WantedBy"), "multi-user.target");
    if let Ok(out) = Command::new("systemd-escape")
        .args(["--path", "--suffix=mount", "/opt/rocm/lib/kpack-all"])
        .output()
    {
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            unit_name_for("/opt/rocm/lib/kpack-all")
        );
    }
}

const GENERATOR: &str = "/usr/lib/systemd/system-generators/systemd-fstab-generator";

/// The uncommented lines of the fstab example, as fields.
fn fstab_lines(text: &str) -> Vec<Vec<String>> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| l.split_whitespace().map(str::to_owned).collect())
        .collect()
}

#[test]
fn fstab_example_lines_and_their_systemd_units() {
    let fstab = repo().join("mount-helpers/fstab.example");
    let lines = fstab_lines(&std::fs::read_to_string(&fstab).unwrap());
    assert_eq!(lines.len(), 2);
    let types: Vec<&str> = lines.iter().map(|l| l[2].as_str()).collect();
    assert_eq!(types, ["fuse.kpack-fuse", "kpack-fuse"]);
    for l in &lines {
        assert_eq!(l.len(), 6, "{l:?}");
        assert_eq!(l[3], "ro,nodev,nosuid,nofail");
        assert_eq!((l[4].as_str(), l[5].as_str()), ("0", "0"));
    }
    if !Path::new(GENERATOR).exists() {
        eprintln!("SKIPPED: {GENERATOR} is not installed");
        return;
    }
    let out = tempfile::tempdir().unwrap();
    let o = out.path();
    must(
        Command::new(GENERATOR)
            .arg(o)
            .arg(o)
            .arg(o)
            .env("SYSTEMD_FSTAB", &fstab)
            .env("SYSTEMD_PROC_CMDLINE", "")
            .env("SYSTEMD_LOG_LEVEL", "warning"),
    );
    for l in &lines {
        let name = unit_name_for(&l[1]);
        let text = std::fs::read_to_string(o.join(&name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        let keys = unit_keys(&text);
        let get = |k: &str| keys[&("Mount".to_owned(), k.to_owned())].clone();
        assert_eq!(
            [get("What"), get("Where"), get("Type"), get("Options")],
            [&l[0], &l[1], &l[2], &l[3]].map(String::clone)
        );
        // nofail: wanted by local-fs.target, not required, so boot goes on without it.
        assert!(
            o.join("local-fs.target.wants").join(&name).exists(),
            "{name}"
        );
        assert!(
            !o.join("local-fs.target.requires").join(&name).exists(),
            "{name}"
        );
    }
}
