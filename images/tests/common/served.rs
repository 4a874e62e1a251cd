//! A registry written in the test: manifests and blobs served from memory over plain HTTP on
//! 127.0.0.1, for what a real registry will not hold (a corrupt blob, a manifest of 10,000
//! layers) or where starting one per case would be slow. One thread per connection.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use wharf_images::ImageRef;

use super::{diff_id, sha256, MANIFEST};

/// A blob and its digest.
pub type Blob = (String, Vec<u8>);

/// Config media type.
pub const CONFIG: &str = "application/vnd.oci.image.config.v1+json";

/// The config of an image whose layers' uncompressed digests are `diff_ids`, with `extra`
/// fields (`"config": {...}` and the like) merged in.
pub fn config_json(diff_ids: &[String], extra: serde_json::Value) -> Vec<u8> {
    let mut config = serde_json::json!({
        "architecture": "amd64", "os": "linux",
        "rootfs": { "type": "layers", "diff_ids": diff_ids },
    });
    if let (Some(c), serde_json::Value::Object(more)) = (config.as_object_mut(), extra) {
        c.extend(more);
    }
    serde_json::to_vec(&config).unwrap()
}

/// A manifest over the config `config` and the layer descriptors `layers`.
pub fn manifest_json(config: serde_json::Value, layers: Vec<serde_json::Value>) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2, "mediaType": MANIFEST, "config": config, "layers": layers
    }))
    .unwrap()
}

/// A descriptor of `data`.
pub fn descriptor(media_type: &str, data: &[u8]) -> serde_json::Value {
    serde_json::json!({ "mediaType": media_type, "digest": sha256(data), "size": data.len() })
}

/// The manifest, config and layer blobs of an image of one gzip layer holding `layer_tar`;
/// config and layer with their digests.
pub fn one_layer_image(layer_tar: &[u8]) -> (Vec<u8>, Blob, Blob) {
    let layer = super::gzip(layer_tar);
    let config = config_json(&[sha256(layer_tar)], serde_json::json!({}));
    let manifest = manifest_json(
        descriptor(CONFIG, &config),
        vec![descriptor(super::LAYER_GZIP, &layer)],
    );
    (manifest, (sha256(&config), config), (sha256(&layer), layer))
}

/// Reads one HTTP request's head from `reader`: its path and its header lines, lowercased.
pub fn read_request(reader: &mut impl BufRead) -> (String, Vec<String>) {
    let mut line = String::new();
    let _ = reader.read_line(&mut line);
    let path = line.split(' ').nth(1).unwrap_or("").to_string();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).unwrap_or(0) == 0 || h.trim().is_empty() {
            return (path, headers);
        }
        headers.push(h.trim().to_ascii_lowercase());
    }
}

/// Answers `status` with the `extra` header lines (each ending in CRLF) and `body`, of which
/// only the first `cut` bytes are sent (the length says all of it); an error only if the head
/// could not be written.
pub fn respond(
    conn: &mut TcpStream,
    status: &str,
    extra: &str,
    body: &[u8],
    cut: usize,
) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n{extra}\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes())?;
    let _ = conn.write_all(&body[..cut.min(body.len())]);
    Ok(())
}

/// What a [`Served`] registry answers: by path after `/v2/`, a content type and a body.
type Routes = HashMap<String, (String, Vec<u8>)>;

/// A registry of images put into it, served from memory; counts blob requests.
pub struct Served {
    /// `127.0.0.1:port`.
    pub addr: String,
    routes: Arc<Mutex<Routes>>,
    /// Blob requests answered.
    pub blob_requests: Arc<AtomicUsize>,
}

impl Served {
    /// Starts one on a free port; it serves until the test process ends.
    pub fn start() -> Served {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let routes: Arc<Mutex<Routes>> = Arc::default();
        let blob_requests = Arc::new(AtomicUsize::new(0));
        let (r, count) = (routes.clone(), blob_requests.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { return };
                let (r, count) = (r.clone(), count.clone());
                std::thread::spawn(move || {
                    let Ok(read) = conn.try_clone() else { return };
                    let (path, _) = read_request(&mut BufReader::new(read));
                    let key = path.strip_prefix("/v2/").unwrap_or(&path).to_string();
                    if key.contains("/blobs/") {
                        count.fetch_add(1, Ordering::SeqCst);
                    }
                    let found = r.lock().unwrap().get(&key).cloned();
                    let _ = match found {
                        Some((ct, body)) => {
                            let extra = if ct.is_empty() {
                                String::new()
                            } else {
                                format!("Content-Type: {ct}\r\n")
                            };
                            respond(&mut conn, "200 OK", &extra, &body, usize::MAX)
                        }
                        None => respond(&mut conn, "404 Not Found", "", b"{}", usize::MAX),
                    };
                    let _ = conn.shutdown(std::net::Shutdown::Both);
                });
            }
        });
        Served {
            addr,
            routes,
            blob_requests,
        }
    }

    /// Serves `body` at `/v2/<path>`.
    pub fn put(&self, path: &str, content_type: &str, body: Vec<u8>) {
        self.routes
            .lock()
            .unwrap()
            .insert(path.to_string(), (content_type.to_string(), body));
    }

    /// Serves blob `data` of `repo`; returns its descriptor.
    pub fn blob(&self, repo: &str, media_type: &str, data: &[u8]) -> serde_json::Value {
        self.put(&format!("{repo}/blobs/{}", sha256(data)), "", data.to_vec());
        descriptor(media_type, data)
    }

    /// Serves `manifest` as `repo:tag` and by its digest; returns the digest.
    pub fn manifest(&self, repo: &str, tag: &str, manifest: Vec<u8>) -> String {
        let digest = sha256(&manifest);
        self.put(
            &format!("{repo}/manifests/{tag}"),
            MANIFEST,
            manifest.clone(),
        );
        self.put(&format!("{repo}/manifests/{digest}"), MANIFEST, manifest);
        digest
    }

    /// Serves `repo:tag`, an image of `layers` (media type, blob) whose config has the given
    /// diff_ids (`None`: the layers' true ones) and `extra` config fields; returns the
    /// manifest digest.
    pub fn image_with(
        &self,
        repo: &str,
        tag: &str,
        layers: &[(&str, Vec<u8>)],
        diff_ids: Option<&[String]>,
        extra: serde_json::Value,
    ) -> String {
        let ids: Vec<String> = match diff_ids {
            Some(ids) => ids.to_vec(),
            None => layers.iter().map(|(m, b)| diff_id(m, b)).collect(),
        };
        let config = config_json(&ids, extra);
        let config = self.blob(repo, CONFIG, &config);
        let descs = layers.iter().map(|(m, b)| self.blob(repo, m, b)).collect();
        self.manifest(repo, tag, manifest_json(config, descs))
    }

    /// [`Served::image_with`] with the true diff_ids and no extra config.
    pub fn image(&self, repo: &str, tag: &str, layers: &[(&str, Vec<u8>)]) -> String {
        self.image_with(repo, tag, layers, None, serde_json::json!({}))
    }

    /// `addr/repo_tag` as a reference.
    pub fn reference(&self, repo_tag: &str) -> ImageRef {
        format!("{}/{repo_tag}", self.addr).parse().unwrap()
    }
}
