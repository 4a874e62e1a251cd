//! `wharf image`: the node's image store.

use std::path::PathBuf;

use anyhow::Result;
use wharf_api::resources::{format_memory, parse_memory};
use wharf_images::{ImageStore, Limits};

use crate::output;

/// Image commands.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Import a rootfs tarball (.tar, .tar.gz, .tar.zst), a directory or an OCI image layout
    /// (DIR or DIR:TAG) into the store.
    Import {
        /// What to import.
        source: String,
        /// Name jobs use in `image = "NAME"`.
        #[arg(long)]
        name: String,
        #[command(flatten)]
        store: StoreArg,
        #[command(flatten)]
        limits: LimitArgs,
    },
    /// Pull a registry image into the store (`ubuntu:24.04`, `docker://...`,
    /// `nvcr.io#nvidia/pytorch:24.05-py3`, `host:5000/team/app@sha256:...`), as jobs naming it
    /// would; layers already in the store are not fetched again. With `--nodes` (admins), the
    /// named nodes pull it into their own stores, through the controller.
    Pull {
        /// The registry reference.
        reference: String,
        /// Pull on these nodes (`n1,n2`, `gpu[01-16]`) instead of into a local store; each
        /// node's progress and result is printed as it comes.
        #[arg(long, value_name = "NODES", conflicts_with_all = ["store", "config", "max_entries", "max_unpacked", "max_file"])]
        nodes: Option<String>,
        /// With `--nodes`: print each node's result as JSON at the end.
        #[arg(long, requires = "nodes")]
        json: bool,
        #[command(flatten)]
        store: StoreArg,
        #[command(flatten)]
        limits: LimitArgs,
    },
    /// List images: size (a pulled image's layers), the part shared with other images, last
    /// use by a job or a pull, and whether a job uses it now.
    #[command(alias = "ls")]
    List {
        #[command(flatten)]
        store: StoreArg,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show one image: its layers with their sizes and the images sharing each, and its
    /// config (entrypoint, command, environment, user, working directory).
    Inspect {
        /// Image name (as `wharf image ls` shows it).
        name: String,
        #[command(flatten)]
        store: StoreArg,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove an image (refused while a job uses it); a pulled image's root and the layers
    /// no other image uses go with it.
    #[command(alias = "rm")]
    Remove {
        /// Image name.
        name: String,
        #[command(flatten)]
        store: StoreArg,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove pulled images' roots and layers that no image name uses; with `--all`, every
    /// pulled image no job uses (imported images stay); with `--to-quota`, the least recently
    /// used pulled images no job uses until the cache fits `[images] cache_quota`; with
    /// `--shared`, the cluster-wide layer cache (`[images] shared_cache`) instead.
    Prune {
        /// Also remove every pulled image that no job uses (with `--shared`: every layer no
        /// node is copying now).
        #[arg(long, conflicts_with = "to_quota")]
        all: bool,
        /// Evict the cluster-wide layer cache as a node adding to it does: least recently
        /// used layers no node is copying now, down to `[images] shared_cache_quota`.
        #[arg(long, conflicts_with = "to_quota")]
        shared: bool,
        /// Evict as a pull does: least recently used first, down to the configured quota.
        #[arg(long)]
        to_quota: bool,
        /// Only say what would be removed.
        #[arg(long)]
        dry_run: bool,
        #[command(flatten)]
        store: StoreArg,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Limits against archive bombs, for an image that genuinely exceeds the defaults.
#[derive(Debug, clap::Args)]
pub struct LimitArgs {
    /// Most entries (files, directories, links) in the image, all layers together
    /// [default: 1000000].
    #[arg(long, value_name = "N")]
    max_entries: Option<u64>,
    /// Most bytes of file content the image unpacks to, e.g. 100G [default: 64G].
    #[arg(long, value_name = "SIZE", value_parser = parse_memory)]
    max_unpacked: Option<u64>,
    /// Largest single file in the image, e.g. 20G [default: 8G].
    #[arg(long, value_name = "SIZE", value_parser = parse_memory)]
    max_file: Option<u64>,
}

impl LimitArgs {
    /// The default limits with the ones given here.
    fn limits(&self) -> Limits {
        let d = Limits::default();
        Limits {
            max_entries: self.max_entries.unwrap_or(d.max_entries),
            max_unpacked_bytes: self.max_unpacked.unwrap_or(d.max_unpacked_bytes),
            max_file_bytes: self.max_file.unwrap_or(d.max_file_bytes),
            ..d
        }
    }
}

/// Which store.
#[derive(Debug, clap::Args)]
pub struct StoreArg {
    /// The image store directory (default: the configuration's `agent.image_store`).
    #[arg(long, env = "WHARF_IMAGE_STORE")]
    store: Option<PathBuf>,
    /// Configuration file (default /etc/wharf/wharf.toml when present).
    #[arg(long)]
    config: Option<PathBuf>,
}

impl StoreArg {
    /// The store named here, or the one the node's agent uses.
    fn path(&self) -> Result<PathBuf> {
        Ok(match &self.store {
            Some(p) => p.clone(),
            None => {
                crate::config::load(self.config.as_deref())?
                    .agent
                    .image_store
            }
        })
    }

    /// Opens the store named here, or the one the node's agent uses, creating it if missing.
    fn open(self) -> Result<ImageStore> {
        Ok(ImageStore::open(self.path()?)?)
    }

    /// Opens the store to read it: `Err` with its path when there is none there yet, which
    /// holds no image, rather than creating it (and the directories above it) just to look.
    fn open_existing(self) -> Result<std::result::Result<ImageStore, PathBuf>> {
        let path = self.path()?;
        match std::fs::symlink_metadata(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Err(path)),
            _ => Ok(Ok(ImageStore::open(path)?)),
        }
    }

    /// The configuration's cache quota (`[images] cache_quota`).
    fn quota(&self) -> Result<Option<u64>> {
        crate::config::load(self.config.as_deref())?.images.quota()
    }

    /// The configuration's shared layer cache (`[images] shared_cache`), checked.
    fn shared_cache(&self) -> Result<Option<wharf_images::SharedCache>> {
        crate::config::load(self.config.as_deref())?
            .images
            .shared_cache()
    }

    /// The configuration's registry settings (`[images]`).
    fn registry(&self) -> Result<wharf_images::registry::RegistryOptions> {
        crate::config::load(self.config.as_deref())?
            .images
            .registry()
    }
}

/// One plain line per step of a pull (what the registry named is cleaned before printing).
fn print_progress(event: &wharf_images::PullEvent) {
    use wharf_images::PullEvent;
    match event {
        PullEvent::Resolved {
            digest,
            layers,
            bytes,
        } => println!(
            "Resolved {}: {layers} layers, {} to fetch at most",
            output::clean(digest),
            format_memory(*bytes)
        ),
        PullEvent::Layer {
            index,
            digest,
            size,
            fetched,
        } => println!(
            "Layer {index} {} ({}): {}",
            output::clean(digest),
            format_memory(*size),
            if *fetched {
                "fetched and unpacked"
            } else {
                "already here"
            }
        ),
        PullEvent::Bytes { .. } | PullEvent::Done(_) => {}
    }
}

/// Where a pull stands, as a terminal's progress bar shows it: bytes (a layer that was already
/// in the store counts as done at once) and layers.
#[derive(Debug, Default, Clone, PartialEq)]
struct PullMeter {
    /// Compressed bytes of every layer.
    total: u64,
    layers: usize,
    layers_done: usize,
    /// Bytes of the layers that were already here.
    already: u64,
    /// Bytes downloaded so far.
    fetched: u64,
}

impl PullMeter {
    fn apply(&mut self, event: &wharf_images::PullEvent) {
        use wharf_images::PullEvent;
        match event {
            PullEvent::Resolved { layers, bytes, .. } => {
                self.total = *bytes;
                self.layers = *layers;
            }
            PullEvent::Layer { size, fetched, .. } => {
                self.layers_done += 1;
                if !fetched {
                    self.already += size;
                }
            }
            PullEvent::Bytes { fetched } => self.fetched = *fetched,
            PullEvent::Done(_) => {}
        }
    }

    /// Bytes done, never past the total.
    fn position(&self) -> u64 {
        (self.already + self.fetched).min(self.total)
    }

    fn message(&self) -> String {
        format!("{} of {} layers", self.layers_done, self.layers)
    }
}

/// The pull's bar: layers done, bytes, rate and time left.
fn bar_style() -> Result<indicatif::ProgressStyle> {
    Ok(indicatif::ProgressStyle::with_template(
        "{msg:>16} [{wide_bar}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
    )?
    .progress_chars("=> "))
}

/// Reports a pull's events: a progress bar (bytes, rate, layers) on a terminal, else
/// [`print_progress`]'s lines.
fn reporter() -> Result<Box<dyn FnMut(wharf_images::PullEvent) + Send>> {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return Ok(Box::new(|event| print_progress(&event)));
    }
    let bar = indicatif::ProgressBar::new(0).with_style(bar_style()?);
    let mut meter = PullMeter::default();
    Ok(Box::new(move |event| {
        meter.apply(&event);
        match &event {
            wharf_images::PullEvent::Resolved { digest, .. } => {
                bar.set_length(meter.total);
                bar.println(format!("Resolved {}", output::clean(digest)));
            }
            wharf_images::PullEvent::Done(_) => bar.finish_and_clear(),
            _ => {}
        }
        bar.set_message(meter.message());
        bar.set_position(meter.position());
    }))
}

/// Runs the command.
pub async fn run(socket: &str, cmd: Command) -> Result<i32> {
    match cmd {
        Command::Import {
            source,
            name,
            store,
            limits,
        } => {
            let s = store.open()?.with_limits(limits.limits());
            let started = std::time::Instant::now();
            let info =
                tokio::task::spawn_blocking(move || s.import(std::path::Path::new(&source), &name))
                    .await??;
            println!(
                "Imported {} ({}, {}, {} unpacked) in {:.1}s",
                output::clean(&info.name),
                output::clean(&info.digest),
                output::clean(&info.source),
                format_memory(info.size),
                started.elapsed().as_secs_f64()
            );
        }
        Command::Pull {
            reference,
            nodes: Some(nodes),
            json,
            ..
        } => return crate::cmd::prepull::run(socket, &reference, &nodes, json).await,
        Command::Pull {
            reference,
            store,
            limits,
            ..
        } => {
            let reference: wharf_images::ImageRef =
                reference.parse().map_err(|e: String| anyhow::anyhow!(e))?;
            let opts = store.registry()?;
            let quota = store.quota()?;
            let shared = store.shared_cache()?;
            let s = store
                .open()?
                .with_limits(limits.limits())
                .with_quota(quota)
                .with_shared_cache(shared);
            let started = std::time::Instant::now();
            let mut report = reporter()?;
            let info = tokio::task::spawn_blocking(move || s.pull(&reference, &opts, &mut report))
                .await??;
            println!(
                "Pulled {} ({}, {} unpacked) in {:.1}s",
                output::clean(&info.name),
                output::clean(&info.digest),
                format_memory(info.size),
                started.elapsed().as_secs_f64()
            );
        }
        Command::List { store, json } => {
            let images = match store.open_existing()? {
                Ok(s) => s.status()?,
                Err(path) => {
                    eprintln!(
                        "wharf image: there is no image store at {} yet: nothing was imported \
                         or pulled into it",
                        output::clean(&path.display().to_string())
                    );
                    vec![]
                }
            };
            if json {
                println!("{}", serde_json::to_string_pretty(&images)?);
            } else {
                let mut t = output::table(&[
                    "NAME", "DIGEST", "SOURCE", "SIZE", "SHARED", "LAST USE", "IN USE",
                ]);
                for i in &images {
                    t.add_row(vec![
                        i.info.name.clone(),
                        short(&i.info.digest),
                        i.info.source.clone(),
                        format_memory(i.disk_size),
                        format_memory(i.shared_size),
                        last_use(i),
                        if i.in_use { "yes" } else { "no" }.to_string(),
                    ]);
                }
                output::print_table(&t);
            }
        }
        Command::Inspect { name, store, json } => {
            let s = match store.open_existing()? {
                Ok(s) => s,
                Err(path) => anyhow::bail!(
                    "image {name:?} is not in the store: there is no image store at {} yet",
                    output::clean(&path.display().to_string())
                ),
            };
            let status = match s.status()?.into_iter().find(|i| i.info.name == name) {
                Some(i) => i,
                // The store's own error: a bad name, or how to get the image.
                None => {
                    s.get(&name)?;
                    anyhow::bail!("image {name:?} is not in the store")
                }
            };
            let layers = s.layers_of(&name)?;
            let config = s.config_of(&name)?;
            if json {
                let doc = serde_json::json!({
                    "image": status,
                    "layers": layers,
                    "config": config.as_ref().and_then(|c| c.get("config")),
                });
                println!("{}", serde_json::to_string_pretty(&doc)?);
            } else {
                print_inspect(&status, &layers, config.as_ref());
            }
        }
        Command::Remove { name, store, json } => {
            store.open()?.remove(&name)?;
            if json {
                println!("{}", serde_json::json!({ "removed": name }));
            } else {
                println!("Removed {}", output::clean(&name));
            }
        }
        Command::Prune {
            all,
            shared: true,
            dry_run,
            store,
            json,
            ..
        } => prune_shared(store, all, dry_run, json).await?,
        Command::Prune {
            all,
            to_quota,
            dry_run,
            store,
            json,
            ..
        } => {
            let quota = match (to_quota, store.quota()?) {
                (false, _) => None,
                (true, Some(q)) => Some(q),
                (true, None) => anyhow::bail!(
                    "--to-quota: the configuration sets no [images] cache_quota to evict down to"
                ),
            };
            let s = store.open()?;
            let removed = tokio::task::spawn_blocking(move || match quota {
                Some(q) => s.evict_to(q, true, dry_run).map(|r| r.unwrap_or_default()),
                None => s.prune(all, dry_run),
            })
            .await??;
            if json {
                let mut doc = serde_json::to_value(&removed)?;
                doc["dry_run"] = dry_run.into();
                println!("{}", serde_json::to_string_pretty(&doc)?);
            } else {
                let verb = if dry_run { "Would remove" } else { "Removed" };
                let mut t = output::table(&["KIND", "WHAT"]);
                for i in &removed.images {
                    t.add_row(["image", i.as_str()]);
                }
                for r in &removed.roots {
                    t.add_row(["root", r.as_str()]);
                }
                for l in &removed.layers {
                    t.add_row(["layer", l.as_str()]);
                }
                if !removed.images.is_empty()
                    || !removed.roots.is_empty()
                    || !removed.layers.is_empty()
                {
                    output::print_table(&t);
                }
                println!(
                    "{verb} {} images, {} roots, {} layers ({}); the cache holds {}",
                    removed.images.len(),
                    removed.roots.len(),
                    removed.layers.len(),
                    format_memory(removed.bytes),
                    format_memory(removed.cache_bytes.saturating_sub(if dry_run {
                        removed.bytes
                    } else {
                        0
                    }))
                );
                print_kept("in use by jobs", &removed.in_use);
            }
        }
    }
    Ok(0)
}

/// `wharf image prune --shared`: evicts the shared layer cache down to its quota, or with
/// `all` every layer no node is copying now.
async fn prune_shared(store: StoreArg, all: bool, dry_run: bool, json: bool) -> Result<()> {
    let Some(cache) = store.shared_cache()? else {
        anyhow::bail!("--shared: the configuration sets no [images] shared_cache");
    };
    let quota = match (all, cache.quota()) {
        (true, _) => 0,
        (false, Some(q)) => q,
        (false, None) => anyhow::bail!(
            "--shared: the configuration sets no [images] shared_cache_quota to evict down to \
             (--all removes every layer no node is copying)"
        ),
    };
    let root = cache.root().to_path_buf();
    let Some(removed) = tokio::task::spawn_blocking(move || cache.evict(quota, dry_run)).await??
    else {
        anyhow::bail!(
            "another node is evicting the shared cache {} now; try again once it is done",
            root.display()
        );
    };
    if json {
        let mut doc = serde_json::to_value(&removed)?;
        doc["dry_run"] = dry_run.into();
        doc["shared_cache"] = root.display().to_string().into();
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    if !removed.layers.is_empty() {
        let mut t = output::table(&["KIND", "WHAT"]);
        for l in &removed.layers {
            t.add_row(["layer", l.as_str()]);
        }
        output::print_table(&t);
    }
    println!(
        "{} {} layers ({}) from the shared cache {}; it holds {}",
        if dry_run { "Would remove" } else { "Removed" },
        removed.layers.len(),
        format_memory(removed.bytes),
        output::clean(&root.display().to_string()),
        format_memory(removed.cache_bytes)
    );
    print_kept("being copied by nodes", &removed.in_use);
    Ok(())
}

/// The layers a prune kept (`why`: what holds them), shortened; nothing when none.
fn print_kept(why: &str, kept: &[String]) {
    if !kept.is_empty() {
        let names: Vec<String> = kept.iter().map(|d| short(d)).collect();
        println!("Kept {} {why}: {}", kept.len(), names.join(", "));
    }
}

/// A digest shortened for a table.
fn short(digest: &str) -> String {
    output::clean(&digest.chars().take(19).collect::<String>()).into_owned()
}

fn last_use(i: &wharf_images::ImageStatus) -> String {
    match i.last_used_ms {
        Some(ms) => output::time(Some(ms)),
        None => "never".into(),
    }
}

/// `wharf image inspect`'s human form.
fn print_inspect(
    i: &wharf_images::ImageStatus,
    layers: &[wharf_images::CachedLayer],
    config: Option<&serde_json::Value>,
) {
    let line = |k: &str, v: &str| println!("{k:<12}{}", output::clean(v));
    line("Name", &i.info.name);
    line("Digest", &i.info.digest);
    line("Source", &i.info.source);
    line("Root", &i.info.rootfs.display().to_string());
    line("Size", &format_memory(i.disk_size));
    line("Shared", &format_memory(i.shared_size));
    line("Last use", &last_use(i));
    line("In use", if i.in_use { "yes" } else { "no" });
    let c = config.and_then(|c| c.get("config"));
    let field = |name: &str| -> String {
        match c.and_then(|c| c.get(name)) {
            Some(serde_json::Value::String(s)) if !s.is_empty() => s.clone(),
            Some(serde_json::Value::Array(a)) if !a.is_empty() => a
                .iter()
                .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string))
                .collect::<Vec<_>>()
                .join(" "),
            _ => "-".into(),
        }
    };
    if config.is_some() {
        line("Entrypoint", &field("Entrypoint"));
        line("Cmd", &field("Cmd"));
        line("User", &field("User"));
        line("WorkingDir", &field("WorkingDir"));
        let env = c
            .and_then(|c| c.get("Env"))
            .and_then(|e| e.as_array())
            .cloned()
            .unwrap_or_default();
        println!("Env");
        for e in env.iter().filter_map(|e| e.as_str()) {
            println!("  {}", output::clean(e));
        }
    }
    if !layers.is_empty() {
        let mut t = output::table(&["#", "LAYER", "SIZE", "IMAGES"]);
        for (n, l) in layers.iter().enumerate() {
            t.add_row(vec![
                (n + 1).to_string(),
                short(&l.digest),
                format_memory(l.size),
                l.images.join(", "),
            ]);
        }
        output::print_table(&t);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wharf_images::PullEvent;

    #[test]
    fn the_bar_counts_layers_already_here_as_done_and_downloads_as_they_come() {
        let mut m = PullMeter::default();
        m.apply(&PullEvent::Resolved {
            digest: "sha256:x".into(),
            layers: 3,
            bytes: 1000,
        });
        assert_eq!((m.position(), m.message()), (0, "0 of 3 layers".into()));
        m.apply(&PullEvent::Layer {
            index: 1,
            digest: "sha256:a".into(),
            size: 600,
            fetched: false,
        });
        m.apply(&PullEvent::Bytes { fetched: 250 });
        assert_eq!((m.position(), m.message()), (850, "1 of 3 layers".into()));
        m.apply(&PullEvent::Bytes { fetched: 400 });
        m.apply(&PullEvent::Layer {
            index: 2,
            digest: "sha256:b".into(),
            size: 100,
            fetched: true,
        });
        m.apply(&PullEvent::Layer {
            index: 3,
            digest: "sha256:c".into(),
            size: 300,
            fetched: true,
        });
        assert_eq!((m.position(), m.message()), (1000, "3 of 3 layers".into()));
        // A download that resumed may read a little more than its size: never past the end.
        m.apply(&PullEvent::Bytes { fetched: 450 });
        assert_eq!(m.position(), 1000);
        assert!(bar_style().is_ok());
    }
}
