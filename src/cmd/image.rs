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
    /// would; layers already in the store are not fetched again.
    Pull {
        /// The registry reference.
        reference: String,
        #[command(flatten)]
        store: StoreArg,
        #[command(flatten)]
        limits: LimitArgs,
    },
    /// List images.
    #[command(alias = "ls")]
    List {
        #[command(flatten)]
        store: StoreArg,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove an image.
    #[command(alias = "rm")]
    Remove {
        /// Image name.
        name: String,
        #[command(flatten)]
        store: StoreArg,
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
    /// Opens the store named here, or the one the node's agent uses.
    fn open(self) -> Result<ImageStore> {
        let path = match self.store {
            Some(p) => p,
            None => {
                crate::config::load(self.config.as_deref())?
                    .agent
                    .image_store
            }
        };
        Ok(ImageStore::open(path)?)
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
        PullEvent::Done(_) => {}
    }
}

/// Runs the command.
pub async fn run(cmd: Command) -> Result<i32> {
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
            store,
            limits,
        } => {
            let reference: wharf_images::ImageRef =
                reference.parse().map_err(|e: String| anyhow::anyhow!(e))?;
            let opts = store.registry()?;
            let s = store.open()?.with_limits(limits.limits());
            let started = std::time::Instant::now();
            let info = tokio::task::spawn_blocking(move || {
                s.pull(&reference, &opts, &mut |event| print_progress(&event))
            })
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
            let images = store.open()?.list()?;
            if json {
                println!("{}", serde_json::to_string_pretty(&images)?);
            } else {
                let mut t = output::table(&["NAME", "DIGEST", "SOURCE", "SIZE", "IMPORTED"]);
                for i in &images {
                    t.add_row(vec![
                        i.name.clone(),
                        i.digest.chars().take(19).collect(),
                        i.source.clone(),
                        format_memory(i.size),
                        output::time(Some(i.created_ms)),
                    ]);
                }
                output::print_table(&t);
            }
        }
        Command::Remove { name, store } => {
            store.open()?.remove(&name)?;
            println!("Removed {}", output::clean(&name));
        }
    }
    Ok(0)
}
