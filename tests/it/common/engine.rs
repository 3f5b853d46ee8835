//! The Docker Engine the container tests use, and the images they deploy, made here without any
//! registry: a root filesystem holding rollgate (stripped) and the libraries `ldd` lists,
//! imported with `docker import` (its command `rollgate sample-service ARGS`), then written out
//! with `docker save` as a user would hand it to `rollgate release add`.
//!
//! The engine is the one at `ROLLGATE_TEST_DOCKER_HOST` (.ci/run starts Debian's `dockerd` on a
//! private socket and says where); without it, a private `dockerd` is started here on
//! [`PRIVATE_SOCKET`] if the host has one installed, and left running for the next test run.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

/// Where a test run's own engine listens when none is named.
const PRIVATE_SOCKET: &str = "/run/rollgate-it-docker/docker.sock";

/// `unix://PATH` of the test engine, as rollgate is told it (`DOCKER_HOST`); nothing started.
pub fn docker_host_named() -> String {
    std::env::var("ROLLGATE_TEST_DOCKER_HOST")
        .unwrap_or_else(|_| format!("unix://{PRIVATE_SOCKET}"))
}

/// `unix://PATH` of an engine that answers.
pub fn docker_host() -> String {
    static HOST: OnceLock<String> = OnceLock::new();
    HOST.get_or_init(|| {
        let host = docker_host_named();
        if !answers(&host) {
            start_private_engine(&host);
        }
        host
    })
    .clone()
}

/// The `docker` client (a test's tool, never rollgate's) aimed at the test engine.
pub fn docker(args: &[&str]) -> std::process::Output {
    Command::new("docker")
        .args(args)
        .env("DOCKER_HOST", docker_host())
        .output()
        .expect("the docker client runs (Debian's docker.io, as .ci/run installs)")
}

fn answers(host: &str) -> bool {
    Command::new("docker")
        .args(["version", "--format", "{{.Server.Version}}"])
        .env("DOCKER_HOST", host)
        .output()
        .is_ok_and(|o| o.status.success())
}

fn start_private_engine(host: &str) {
    let socket = host.trim_start_matches("unix://");
    let run = Path::new(socket).parent().expect("a socket in a folder");
    std::fs::create_dir_all(run).unwrap();
    let data = Path::new("/var/lib/rollgate-it-docker");
    let started = Command::new("dockerd")
        .args(["--iptables=false", "--ip6tables=false", "--bridge=none"])
        .arg("-H")
        .arg(host)
        .arg("--data-root")
        .arg(data.join("data"))
        .arg("--exec-root")
        .arg(run.join("exec"))
        .arg("--pidfile")
        .arg(run.join("dockerd.pid"))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
    assert!(
        started.is_ok(),
        "no Docker Engine at {host} and no dockerd to start: install Debian's docker.io (.ci/run does)"
    );
    assert!(
        super::wait_for(60, || answers(host)),
        "the private dockerd at {host} did not come up"
    );
}

/// A `docker save` archive of an image whose command is `rollgate sample-service ARGS`, made
/// once per binary and arguments (and kept between runs under /tmp).
pub fn sample_image(args: &[&str]) -> PathBuf {
    static MAKING: Mutex<()> = Mutex::new(());
    let _one_at_a_time = MAKING.lock().unwrap_or_else(|e| e.into_inner());
    let folder = images_folder();
    let key = {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        args.hash(&mut hasher);
        hasher.finish()
    };
    let archive = folder.join(format!("sample-{key:016x}.tar"));
    if archive.is_file() {
        return archive;
    }
    let tag = format!(
        "rollgate-it/sample:{}-{key:016x}",
        folder.file_name().unwrap().to_string_lossy()
    );
    let mut command = vec!["/bin/rollgate".to_string(), "sample-service".to_string()];
    command.extend(args.iter().map(|a| a.to_string()));
    let change = format!("CMD {}", serde_json::to_string(&command).unwrap());
    let rootfs = rootfs(&folder);
    let imported = docker(&[
        "import",
        "--change",
        &change,
        rootfs.to_str().unwrap(),
        &tag,
    ]);
    assert!(imported.status.success(), "docker import: {imported:?}");
    let partial = folder.join(format!("sample-{key:016x}.tar.{}", std::process::id()));
    let saved = docker(&["save", "-o", partial.to_str().unwrap(), &tag]);
    assert!(saved.status.success(), "docker save: {saved:?}");
    std::fs::rename(&partial, &archive).unwrap();
    archive
}

/// The image folder of this build of rollgate (its binary's identity names it).
fn images_folder() -> PathBuf {
    let bin = super::bin();
    let identity = bin
        .parent()
        .and_then(Path::file_name)
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| {
            use std::os::unix::fs::MetadataExt;
            let meta = std::fs::metadata(&bin).unwrap();
            format!("{}-{}", meta.ino(), meta.mtime())
        });
    let all = std::env::temp_dir().join("rollgate-it-images");
    let folder = all.join(&identity);
    if !folder.is_dir() {
        // Another build's images are of no more use (each is a copy of a binary).
        for old in std::fs::read_dir(&all).into_iter().flatten().flatten() {
            let _ = std::fs::remove_dir_all(old.path());
        }
        std::fs::create_dir_all(&folder).unwrap();
    }
    folder
}

/// The root filesystem tarball: rollgate stripped, at /bin/rollgate, with its libraries.
fn rootfs(folder: &Path) -> PathBuf {
    build_rootfs(folder, "rootfs", &[], &[])
}

/// A root filesystem tarball `NAME.tar` in `folder` (made once): rollgate stripped at
/// /bin/rollgate, the host's `programs` at the same paths, every library `ldd` lists for them,
/// and the host's `folders` copied whole.
fn build_rootfs(folder: &Path, name: &str, programs: &[&str], folders: &[&str]) -> PathBuf {
    let tarball = folder.join(format!("{name}.tar"));
    if tarball.is_file() {
        return tarball;
    }
    let tree = folder.join(format!("{name}.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tree);
    for dir in ["bin", "tmp", "etc"] {
        std::fs::create_dir_all(tree.join(dir)).unwrap();
    }
    let stripped = Command::new("strip")
        .arg("-o")
        .arg(tree.join("bin/rollgate"))
        .arg(super::bin())
        .status()
        .unwrap();
    assert!(stripped.success());
    let bin = super::bin();
    let binaries: Vec<&Path> = std::iter::once(bin.as_path())
        .chain(programs.iter().map(Path::new))
        .collect();
    let copy_in = |from: &Path, to: &Path| {
        let inside = tree.join(to.strip_prefix("/").unwrap());
        std::fs::create_dir_all(inside.parent().unwrap()).unwrap();
        std::fs::copy(from, &inside).unwrap();
    };
    for binary in &binaries {
        if *binary != bin.as_path() {
            // At the path it is named by, whatever link led there on the host.
            copy_in(&std::fs::canonicalize(binary).unwrap(), binary);
        }
        let ldd = Command::new("ldd").arg(binary).output().unwrap();
        for library in String::from_utf8_lossy(&ldd.stdout)
            .split_whitespace()
            .filter(|w| w.starts_with('/'))
        {
            copy_in(Path::new(library), Path::new(library));
        }
    }
    for copied in folders {
        let inside = tree.join(copied.trim_start_matches('/'));
        std::fs::create_dir_all(inside.parent().unwrap()).unwrap();
        let done = Command::new("cp")
            .arg("-a")
            .arg(copied)
            .arg(&inside)
            .status()
            .unwrap();
        assert!(done.success());
    }
    std::fs::write(tree.join("etc/passwd"), "root:x:0:0:root:/:/bin/rollgate\n").unwrap();
    let partial = folder.join(format!("{name}.tar.{}", std::process::id()));
    let packed = Command::new("tar")
        .arg("-C")
        .arg(&tree)
        .arg("-cf")
        .arg(&partial)
        .arg(".")
        .status()
        .unwrap();
    assert!(packed.success());
    std::fs::rename(&partial, &tarball).unwrap();
    let _ = std::fs::remove_dir_all(&tree);
    tarball
}

/// A `docker save` archive of an image with Python, a shell, `setsid` and `sleep` beside
/// rollgate, whose command runs `script` (at /script.py) with Python, then, if it succeeded,
/// serves as `rollgate sample-service` (a script that fails ends the container). Made once per binary and script.
pub fn python_image(script: &str) -> PathBuf {
    python_image_with(script, &[])
}

/// [`python_image`] with more Dockerfile instructions for `docker import --change`
/// (`VOLUME /vol`).
pub fn python_image_with(script: &str, more: &[&str]) -> PathBuf {
    static MAKING: Mutex<()> = Mutex::new(());
    let _one_at_a_time = MAKING.lock().unwrap_or_else(|e| e.into_inner());
    let folder = images_folder();
    let change = r#"CMD ["/bin/sh", "-c", "/usr/bin/python3 /script.py && exec /bin/rollgate sample-service"]"#;
    let key = {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        (script, change, more).hash(&mut hasher);
        hasher.finish()
    };
    let archive = folder.join(format!("python-{key:016x}.tar"));
    if archive.is_file() {
        return archive;
    }
    let base = build_rootfs(
        &folder,
        "rootfs-python",
        &[
            "/usr/bin/python3",
            "/bin/sh",
            "/usr/bin/setsid",
            "/usr/bin/sleep",
        ],
        &["/usr/lib/python3.11"],
    );
    // The script as one more layer: a tarball of the base with it added.
    let with_script = folder.join(format!("python-{key:016x}.rootfs.tar"));
    std::fs::copy(&base, &with_script).unwrap();
    let staged = folder.join(format!("script-{key:016x}"));
    std::fs::create_dir_all(&staged).unwrap();
    std::fs::write(staged.join("script.py"), script).unwrap();
    let appended = Command::new("tar")
        .arg("-rf")
        .arg(&with_script)
        .arg("-C")
        .arg(&staged)
        .arg("script.py")
        .status()
        .unwrap();
    assert!(appended.success());
    let tag = format!(
        "rollgate-it/python:{}-{key:016x}",
        folder.file_name().unwrap().to_string_lossy()
    );
    let mut import = vec!["import", "--change", change];
    for instruction in more {
        import.extend(["--change", instruction]);
    }
    import.extend([with_script.to_str().unwrap(), tag.as_str()]);
    let imported = docker(&import);
    assert!(imported.status.success(), "docker import: {imported:?}");
    let partial = folder.join(format!("python-{key:016x}.tar.{}", std::process::id()));
    let saved = docker(&["save", "-o", partial.to_str().unwrap(), &tag]);
    assert!(saved.status.success(), "docker save: {saved:?}");
    std::fs::rename(&partial, &archive).unwrap();
    let _ = std::fs::remove_file(&with_script);
    let _ = std::fs::remove_dir_all(&staged);
    archive
}

/// The containers of the test engine that carry `dev.rollgate.root=ROOT`, with their labels
/// and state (`docker ps -a`).
pub fn containers_of(root: &Path) -> Vec<serde_json::Value> {
    let listed = docker(&[
        "ps",
        "-a",
        "--filter",
        &format!("label=dev.rollgate.root={}", root.display()),
        "--format",
        "{{json .}}",
    ]);
    String::from_utf8_lossy(&listed.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// `docker inspect` of one container.
pub fn inspect(id: &str) -> serde_json::Value {
    let out = docker(&["inspect", id]);
    let all: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    all[0].clone()
}

/// Waits for the engine to have `count` containers of `root`, up to `seconds`.
pub fn wait_for_containers(root: &Path, count: usize, seconds: u64) -> bool {
    super::wait_for(seconds, || containers_of(root).len() == count)
}

/// Removes every container of `root` (a test's end).
pub fn remove_containers_of(root: &Path) {
    for container in containers_of(root) {
        if let Some(id) = container["ID"].as_str() {
            let _ = docker(&["rm", "-f", id]);
        }
    }
}

/// The tag of the image in `archive`, loaded into the test engine (`docker load`).
pub fn loaded_tag(archive: &Path) -> String {
    let out = docker(&["load", "-i", archive.to_str().unwrap()]);
    assert!(out.status.success(), "docker load: {out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("Loaded image: ").map(str::to_string))
        .expect("a tagged image")
}

/// The image ID the engine has for `reference`.
pub fn image_id(reference: &str) -> String {
    let out = docker(&["image", "inspect", "--format", "{{.Id}}", reference]);
    assert!(out.status.success(), "docker image inspect: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// `HOST:PORT` of a registry on 127.0.0.1 (Debian's docker-registry): the one at
/// `ROLLGATE_TEST_REGISTRY` (.ci/run starts it), else one started here and reused by later runs.
pub fn registry() -> String {
    static REGISTRY: OnceLock<String> = OnceLock::new();
    REGISTRY
        .get_or_init(|| {
            if let Ok(address) = std::env::var("ROLLGATE_TEST_REGISTRY") {
                return address;
            }
            let dir = Path::new("/var/lib/rollgate-it-registry");
            let noted = dir.join("address");
            if let Ok(address) = std::fs::read_to_string(&noted) {
                if registry_answers(address.trim()) {
                    return address.trim().to_string();
                }
            }
            std::fs::create_dir_all(dir.join("data")).unwrap();
            let address = format!("127.0.0.1:{}", super::free_port());
            let config = dir.join("config.yml");
            std::fs::write(
                &config,
                format!(
                    "version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {address}\n",
                    dir.join("data").display()
                ),
            )
            .unwrap();
            serve_registry(&config);
            assert!(
                super::wait_for(30, || registry_answers(&address)),
                "the registry at {address} did not come up"
            );
            std::fs::write(&noted, &address).unwrap();
            address
        })
        .clone()
}

fn registry_answers(address: &str) -> bool {
    std::net::TcpStream::connect(address).is_ok_and(|mut stream| {
        use std::io::{Read, Write};
        let asked = stream.write_all(
            format!("GET /v2/ HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n").as_bytes(),
        );
        let mut answer = String::new();
        asked.is_ok()
            && stream.read_to_string(&mut answer).is_ok()
            && answer.starts_with("HTTP/1.1 200")
    })
}

/// The image of a `docker save` archive as an OCI image layout archive, written by skopeo (a
/// tool nobody here wrote), kept beside it.
pub fn oci_archive(docker_archive: &Path) -> PathBuf {
    let oci = docker_archive.with_extension("oci.tar");
    if oci.is_file() {
        return oci;
    }
    let partial = docker_archive.with_extension(format!("oci.{}", std::process::id()));
    let _ = std::fs::remove_file(&partial);
    let copied = Command::new("skopeo")
        .arg("copy")
        .arg(format!("docker-archive:{}", docker_archive.display()))
        .arg(format!("oci-archive:{}", partial.display()))
        .output()
        .expect("Debian's skopeo (.ci/run installs it)");
    assert!(copied.status.success(), "skopeo copy: {copied:?}");
    std::fs::rename(&partial, &oci).unwrap();
    oci
}

/// A registry that asks for a password (Debian's docker-registry with TLS and an htpasswd
/// file), stopped when dropped.
pub struct AuthRegistry {
    pub address: String,
    pub user: String,
    pub password: String,
    /// A docker client configuration logged in to it (`docker --config DIR`).
    pub client: PathBuf,
    child: std::process::Child,
    dir: PathBuf,
}

impl Drop for AuthRegistry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl AuthRegistry {
    /// Starts one on a free loopback port: a self-signed certificate made with openssl (the
    /// engine trusts a loopback registry without verifying it), a bcrypt password made with
    /// Debian's Python, and a docker client logged in.
    pub fn start() -> AuthRegistry {
        let dir = std::env::temp_dir().join(format!(
            "rollgate-it-auth-registry-{}-{}",
            std::process::id(),
            super::free_port()
        ));
        std::fs::create_dir_all(dir.join("data")).unwrap();
        let address = format!("127.0.0.1:{}", super::free_port());
        let made = Command::new("openssl")
            .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
            .args(["ec_paramgen_curve:P-256", "-nodes", "-days", "2"])
            .args([
                "-subj",
                "/CN=127.0.0.1",
                "-addext",
                "subjectAltName=IP:127.0.0.1",
            ])
            .arg("-keyout")
            .arg(dir.join("key.pem"))
            .arg("-out")
            .arg(dir.join("cert.pem"))
            .output()
            .unwrap();
        assert!(made.status.success(), "openssl: {made:?}");
        let user = "deployer".to_string();
        let password = format!("pw-{}-{}", std::process::id(), super::free_port());
        let hashed = Command::new("/usr/bin/python3")
            .args(["-W", "ignore", "-c"])
            .arg("import crypt, sys; print(crypt.crypt(sys.argv[1], crypt.mksalt(crypt.METHOD_BLOWFISH)))")
            .arg(&password)
            .output()
            .unwrap();
        assert!(hashed.status.success(), "bcrypt: {hashed:?}");
        let hash = String::from_utf8_lossy(&hashed.stdout).trim().to_string();
        std::fs::write(dir.join("htpasswd"), format!("{user}:{hash}\n")).unwrap();
        let config = dir.join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {data}\nhttp:\n  addr: {address}\n  tls:\n    certificate: {dir}/cert.pem\n    key: {dir}/key.pem\nauth:\n  htpasswd:\n    realm: rollgate-it\n    path: {dir}/htpasswd\n",
                data = dir.join("data").display(),
                dir = dir.display()
            ),
        )
        .unwrap();
        let child = serve_registry(&config);
        let client = dir.join("client");
        let registry = AuthRegistry {
            address,
            user,
            password,
            client,
            child,
            dir,
        };
        assert!(super::wait_for(30, || std::net::TcpStream::connect(
            &registry.address
        )
        .is_ok()));
        let login = registry.docker(&[
            "login",
            &registry.address,
            "-u",
            &registry.user,
            "--password-stdin",
        ]);
        assert!(login.status.success(), "docker login: {login:?}");
        registry
    }

    /// The docker client, logged in to this registry (the password on its stdin).
    pub fn docker(&self, args: &[&str]) -> std::process::Output {
        use std::io::Write;
        let mut child = Command::new("docker")
            .arg("--config")
            .arg(&self.client)
            .args(args)
            .env("DOCKER_HOST", docker_host())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let _ = child
            .stdin
            .take()
            .unwrap()
            .write_all(self.password.as_bytes());
        child.wait_with_output().unwrap()
    }

    /// What `docker login` wrote: the client's config.json.
    pub fn login_file(&self) -> String {
        std::fs::read_to_string(self.client.join("config.json")).unwrap()
    }
}

/// Debian's docker-registry serving the `config` file, quiet.
fn serve_registry(config: &std::path::Path) -> std::process::Child {
    Command::new("docker-registry")
        .arg("serve")
        .arg(config)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("Debian's docker-registry (.ci/run installs it)")
}
