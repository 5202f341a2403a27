//! Hand-written declarations of the parts of librados.h and librbd.h (Ceph 16+) the binding
//! uses. Only the symbols are declared; the types are opaque pointers, plain integers and one
//! plain struct (`rbd_image_info_t`), laid out as the headers say.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_void};

pub(crate) type rados_t = *mut c_void;
pub(crate) type rados_ioctx_t = *mut c_void;
pub(crate) type rbd_image_t = *mut c_void;
pub(crate) type rbd_completion_t = *mut c_void;
pub(crate) type rbd_callback_t = extern "C" fn(cb: rbd_completion_t, arg: *mut c_void);
pub(crate) type rbd_update_callback_t = extern "C" fn(arg: *mut c_void);
pub(crate) type rados_watchcb2_t =
    extern "C" fn(arg: *mut c_void, notify_id: u64, handle: u64, notifier_id: u64, data: *mut c_void, data_len: usize);
pub(crate) type rados_watcherrcb_t = extern "C" fn(pre: *mut c_void, cookie: u64, err: c_int);

/// `LIBRADOS_OP_FLAG_FADVISE_FUA` (librados.h).
pub(crate) const LIBRADOS_OP_FLAG_FADVISE_FUA: c_int = 0x80;
/// `RBD_LOCK_MODE_EXCLUSIVE` (librbd.h, `rbd_lock_mode_t`, a C enum: int-sized).
pub(crate) const RBD_LOCK_MODE_EXCLUSIVE: c_int = 0;

pub(crate) const RBD_MAX_BLOCK_NAME_SIZE: usize = 24;
pub(crate) const RBD_MAX_IMAGE_NAME_SIZE: usize = 96;

/// `rbd_image_info_t` (librbd.h).
#[repr(C)]
pub(crate) struct rbd_image_info_t {
    pub(crate) size: u64,
    pub(crate) obj_size: u64,
    pub(crate) num_objs: u64,
    pub(crate) order: c_int,
    pub(crate) block_name_prefix: [c_char; RBD_MAX_BLOCK_NAME_SIZE],
    pub(crate) parent_pool: i64,
    pub(crate) parent_name: [c_char; RBD_MAX_IMAGE_NAME_SIZE],
}

#[link(name = "rados")]
unsafe extern "C" {
    pub(crate) fn rados_create2(pcluster: *mut rados_t, clustername: *const c_char, name: *const c_char, flags: u64) -> c_int;
    pub(crate) fn rados_conf_read_file(cluster: rados_t, path: *const c_char) -> c_int;
    pub(crate) fn rados_conf_set(cluster: rados_t, option: *const c_char, value: *const c_char) -> c_int;
    pub(crate) fn rados_conf_get(cluster: rados_t, option: *const c_char, buf: *mut c_char, len: usize) -> c_int;
    pub(crate) fn rados_connect(cluster: rados_t) -> c_int;
    pub(crate) fn rados_shutdown(cluster: rados_t);
    pub(crate) fn rados_get_instance_id(cluster: rados_t) -> u64;
    pub(crate) fn rados_getaddrs(cluster: rados_t, addrs: *mut *mut c_char) -> c_int;
    pub(crate) fn rados_blocklist_add(cluster: rados_t, client_address: *mut c_char, expire_seconds: u32) -> c_int;
    pub(crate) fn rados_ioctx_create(cluster: rados_t, pool_name: *const c_char, ioctx: *mut rados_ioctx_t) -> c_int;
    pub(crate) fn rados_ioctx_destroy(io: rados_ioctx_t);
    pub(crate) fn rados_ioctx_set_namespace(io: rados_ioctx_t, nspace: *const c_char);
    pub(crate) fn rados_cluster_fsid(cluster: rados_t, buf: *mut c_char, len: usize) -> c_int;
    pub(crate) fn rados_write_full(io: rados_ioctx_t, oid: *const c_char, buf: *const c_char, len: usize) -> c_int;
    pub(crate) fn rados_read(io: rados_ioctx_t, oid: *const c_char, buf: *mut c_char, len: usize, off: u64) -> c_int;
    pub(crate) fn rados_lock_exclusive(
        io: rados_ioctx_t,
        oid: *const c_char,
        name: *const c_char,
        cookie: *const c_char,
        desc: *const c_char,
        duration: *mut libc::timeval,
        flags: u8,
    ) -> c_int;
    pub(crate) fn rados_unlock(io: rados_ioctx_t, oid: *const c_char, name: *const c_char, cookie: *const c_char) -> c_int;
    pub(crate) fn rados_watch3(
        io: rados_ioctx_t,
        o: *const c_char,
        cookie: *mut u64,
        watchcb: rados_watchcb2_t,
        watcherrcb: rados_watcherrcb_t,
        timeout: u32,
        arg: *mut c_void,
    ) -> c_int;
    pub(crate) fn rados_watch_check(io: rados_ioctx_t, cookie: u64) -> c_int;
    pub(crate) fn rados_unwatch2(io: rados_ioctx_t, cookie: u64) -> c_int;
    pub(crate) fn rados_watch_flush(cluster: rados_t) -> c_int;
    pub(crate) fn rados_notify2(
        io: rados_ioctx_t,
        o: *const c_char,
        buf: *const c_char,
        buf_len: c_int,
        timeout_ms: u64,
        reply_buffer: *mut *mut c_char,
        reply_buffer_len: *mut usize,
    ) -> c_int;
    pub(crate) fn rados_notify_ack(
        io: rados_ioctx_t,
        o: *const c_char,
        notify_id: u64,
        cookie: u64,
        buf: *const c_char,
        buf_len: c_int,
    ) -> c_int;
    pub(crate) fn rados_buffer_free(buf: *mut c_char);
}

#[link(name = "rbd")]
unsafe extern "C" {
    pub(crate) fn rbd_create(io: rados_ioctx_t, name: *const c_char, size: u64, order: *mut c_int) -> c_int;
    pub(crate) fn rbd_remove(io: rados_ioctx_t, name: *const c_char) -> c_int;
    pub(crate) fn rbd_open(io: rados_ioctx_t, name: *const c_char, image: *mut rbd_image_t, snap_name: *const c_char) -> c_int;
    pub(crate) fn rbd_close(image: rbd_image_t) -> c_int;
    pub(crate) fn rbd_resize(image: rbd_image_t, size: u64) -> c_int;
    pub(crate) fn rbd_stat(image: rbd_image_t, info: *mut rbd_image_info_t, infosize: usize) -> c_int;
    pub(crate) fn rbd_get_size(image: rbd_image_t, size: *mut u64) -> c_int;
    pub(crate) fn rbd_get_features(image: rbd_image_t, features: *mut u64) -> c_int;
    pub(crate) fn rbd_get_id(image: rbd_image_t, id: *mut c_char, id_len: usize) -> c_int;

    pub(crate) fn rbd_is_exclusive_lock_owner(image: rbd_image_t, is_owner: *mut c_int) -> c_int;
    pub(crate) fn rbd_lock_acquire(image: rbd_image_t, lock_mode: c_int) -> c_int;
    pub(crate) fn rbd_lock_release(image: rbd_image_t) -> c_int;
    pub(crate) fn rbd_lock_get_owners(
        image: rbd_image_t,
        lock_mode: *mut c_int,
        lock_owners: *mut *mut c_char,
        max_lock_owners: *mut usize,
    ) -> c_int;
    pub(crate) fn rbd_lock_get_owners_cleanup(lock_owners: *mut *mut c_char, lock_owner_count: usize);
    pub(crate) fn rbd_lock_break(image: rbd_image_t, lock_mode: c_int, lock_owner: *const c_char) -> c_int;

    pub(crate) fn rbd_metadata_get(image: rbd_image_t, key: *const c_char, value: *mut c_char, val_len: *mut usize) -> c_int;
    pub(crate) fn rbd_metadata_set(image: rbd_image_t, key: *const c_char, value: *const c_char) -> c_int;

    pub(crate) fn rbd_update_watch(image: rbd_image_t, handle: *mut u64, watch_cb: rbd_update_callback_t, arg: *mut c_void) -> c_int;
    pub(crate) fn rbd_update_unwatch(image: rbd_image_t, handle: u64) -> c_int;

    pub(crate) fn rbd_aio_create_completion(cb_arg: *mut c_void, complete_cb: rbd_callback_t, c: *mut rbd_completion_t) -> c_int;
    pub(crate) fn rbd_aio_get_return_value(c: rbd_completion_t) -> isize;
    pub(crate) fn rbd_aio_release(c: rbd_completion_t);
    pub(crate) fn rbd_aio_read(image: rbd_image_t, off: u64, len: usize, buf: *mut c_char, c: rbd_completion_t) -> c_int;
    pub(crate) fn rbd_aio_write2(
        image: rbd_image_t,
        off: u64,
        len: usize,
        buf: *const c_char,
        c: rbd_completion_t,
        op_flags: c_int,
    ) -> c_int;
    pub(crate) fn rbd_aio_flush(image: rbd_image_t, c: rbd_completion_t) -> c_int;
    pub(crate) fn rbd_aio_discard(image: rbd_image_t, off: u64, len: u64, c: rbd_completion_t) -> c_int;
    pub(crate) fn rbd_aio_writesame(
        image: rbd_image_t,
        off: u64,
        len: usize,
        buf: *const c_char,
        data_len: usize,
        c: rbd_completion_t,
        op_flags: c_int,
    ) -> c_int;
    pub(crate) fn rbd_aio_write_zeroes(
        image: rbd_image_t,
        off: u64,
        len: usize,
        c: rbd_completion_t,
        zero_flags: c_int,
        op_flags: c_int,
    ) -> c_int;
    pub(crate) fn rbd_aio_compare_and_write(
        image: rbd_image_t,
        off: u64,
        len: usize,
        cmp_buf: *const c_char,
        buf: *const c_char,
        c: rbd_completion_t,
        mismatch_off: *mut u64,
        op_flags: c_int,
    ) -> isize;
}
