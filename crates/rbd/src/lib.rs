//! riser-rbd: a thin, safe binding to Ceph's librados and librbd, enough to serve iSCSI LUNs
//! from RBD images.
//!
//! * [`Cluster::connect`] with [`ClusterOptions`] gives a shared connection; [`Cluster::ioctx`]
//!   an I/O context on a pool; [`Image::open`] an image.
//! * Image I/O is asynchronous (`rbd_aio_*`) and exposed as std futures ([`IoFuture`]) that
//!   need no particular runtime: librbd's completion callback stores the result and wakes the
//!   task. Buffers belong to the request until librbd is done with them, so dropping a future
//!   early is safe. The futures are `Send + 'static`.
//! * Resizes and other header changes: [`Image::watch_updates`]. Exclusive lock:
//!   [`Image::lock_acquire`] and friends (their docs say what librbd does on its own).
//! * RADOS watch/notify on any object ([`Ioctx::watch`], [`Ioctx::notify`]) and blocklisting
//!   ([`Cluster::blocklist_add`]) for coordinating gateways.
//!
//! **librbd's cache must be off** for LUN serving: pass `rbd_cache=false` in
//! [`ClusterOptions::options`] (or use [`ClusterOptions::for_lun_serving`]).
//!
//! Talking to a cluster needs the cargo feature **`rbd`** (off by default), which links
//! `librbd.so.1` and `librados.so.2` dynamically (Debian: `librbd-dev`). Both are LGPL-2.1;
//! dynamic linking keeps this crate's own licence unaffected. Without the feature only the
//! plain types ([`Error`], [`CompareError`], [`ClusterOptions`], the notify types) are built,
//! so the workspace builds on machines without Ceph.
//!
//! Blocking calls (connect, open, lock, metadata, resize, notify) block the calling thread;
//! call them from a blocking-friendly context (e.g. `spawn_blocking`) in async code.
//!
//! ## Where it sits
//!
//! riser-target's `rbd` module (its feature `rbd`) builds its `RbdStore`, an `AsyncBackend`, on
//! this binding, and riser-service opens `rbd:POOL/IMAGE` stores through it. The crate knows
//! nothing of SCSI or iSCSI: it could serve any program that needs RBD images as futures.
//!
//! ## Examples
//!
//! The plain types are built everywhere (run): connection settings, and the reply of a RADOS
//! notification as librados hands it over.
//!
//! ```rust
//! use riser_rbd::{ClusterOptions, NotifyReplies};
//!
//! let opts = ClusterOptions::for_lun_serving(None).with_option("client_mount_timeout", "5");
//! assert_eq!(opts.options[0], ("rbd_cache".to_string(), "false".to_string()));
//! assert_eq!(opts.client_id(), "admin");
//!
//! // One watcher (gid 4100, cookie 7) acknowledged with "ok"; none timed out.
//! let mut buf = 1u32.to_le_bytes().to_vec();
//! buf.extend(4100u64.to_le_bytes());
//! buf.extend(7u64.to_le_bytes());
//! buf.extend(2u32.to_le_bytes());
//! buf.extend(b"ok");
//! buf.extend(0u32.to_le_bytes());
//! let replies = NotifyReplies::parse(&buf).unwrap();
//! assert_eq!((replies.acks[0].gid, &replies.acks[0].payload[..]), (4100, &b"ok"[..]));
//! assert!(replies.timeouts.is_empty());
//! ```
//!
//! Image I/O needs the feature `rbd` and a running Ceph cluster, so this one is `no_run`:
//! `cargo test --doc` compiles it (with `--features rbd`; without the feature the items it uses
//! do not exist and it compiles to nothing) but never runs it, since there is no cluster to
//! talk to there. The crate's `cluster` integration test runs the same calls against a private
//! single-node cluster when one is available.
//!
//! ```rust,no_run
//! # #[cfg(feature = "rbd")]
//! # fn main() -> Result<(), riser_rbd::Error> {
//! use riser_rbd::{Cluster, ClusterOptions, Error, Image};
//!
//! /// Asynchronous I/O: std futures, awaited on any executor (tokio in riser-target).
//! async fn copy_first_block(image: &Image) -> Result<(), Error> {
//!     let data = image.read(0, 4096, Vec::with_capacity(4096)).await?;
//!     image.write(4096, bytes::Bytes::from(data), true).await // FUA: on the OSDs when done
//! }
//!
//! // Blocking setup: ceph.conf from the default search, librbd's cache off.
//! let cluster = Cluster::connect(&ClusterOptions::for_lun_serving(None))?;
//! let ioctx = cluster.ioctx("rbd")?;
//! let image = Image::open(&ioctx, "lun0")?;
//! println!("{} bytes", image.size()?);
//! # let _ = copy_first_block(&image);
//! # Ok(())
//! # }
//! # #[cfg(not(feature = "rbd"))]
//! # fn main() {}
//! ```

#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![cfg_attr(not(feature = "rbd"), forbid(unsafe_code))]
// These docs describe the binding the feature `rbd` builds; without it its items do not exist.
#![cfg_attr(not(feature = "rbd"), allow(rustdoc::broken_intra_doc_links))]

mod error;
mod notify;
mod options;

#[cfg(feature = "rbd")]
#[allow(unsafe_code)]
mod aio;
#[cfg(feature = "rbd")]
#[allow(unsafe_code)]
mod ffi;
#[cfg(feature = "rbd")]
#[allow(unsafe_code)]
mod image;
#[cfg(feature = "rbd")]
#[allow(unsafe_code)]
mod rados;
#[cfg(feature = "rbd")]
#[allow(unsafe_code)]
mod sched;

pub use error::{CompareError, EBLOCKLISTED, EBUSY, EILSEQ, ENOENT, EROFS, ETIMEDOUT, Error};
pub use notify::{Notify, NotifyAck, NotifyReplies, NotifyTimeout};
pub use options::ClusterOptions;

#[cfg(feature = "rbd")]
#[cfg_attr(docsrs, doc(cfg(feature = "rbd")))]
pub use aio::IoFuture;
#[cfg(feature = "rbd")]
#[cfg_attr(docsrs, doc(cfg(feature = "rbd")))]
pub use image::{Image, ImageInfo, UpdateWatch, features};
#[cfg(feature = "rbd")]
#[cfg_attr(docsrs, doc(cfg(feature = "rbd")))]
pub use rados::{Cluster, Ioctx, PendingAck, Watch};

#[cfg(all(test, feature = "rbd"))]
mod tests {
    use super::*;

    fn send_sync<T: Send + Sync + 'static>() {}
    fn send_static<T: Send + 'static>() {}

    #[test]
    fn handles_are_send_and_sync_futures_send_static() {
        send_sync::<Cluster>();
        send_sync::<Ioctx>();
        send_sync::<Image>();
        send_sync::<Watch>();
        send_sync::<UpdateWatch>();
        send_static::<IoFuture<Result<Vec<u8>, Error>>>();
        send_static::<IoFuture<Result<(), CompareError>>>();
    }
}
