//! A file service over bulk transfers: the server reads and writes byte
//! ranges of the files in one directory, moving the data through the
//! client's bulk buffers (the server pushes into the client's sink for a
//! read and pulls the client's source for a write); the client copies a
//! file through it and checks the copy's checksum.
//!
//! The handlers run on the RPC machine's handler pool
//! ([`RpcHandle::on_blocking`]), which does the file I/O and waits for the
//! bulk transfer before replying: the transport's threads never block on
//! the disk.
//!
//! ```
//! use colibri_bulk_mem::MemTransport;
//! use colibri_examples::bulk_file;
//!
//! let dir = std::env::temp_dir().join(format!("colibri-doc-{}", std::process::id()));
//! let report = bulk_file::run_local(&MemTransport::default(), &dir, 3 << 20).unwrap();
//! assert!(report.verified);
//! std::fs::remove_dir_all(&dir).unwrap();
//! ```

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use colibri_net::Transport;
use colibri_net::checksum::{Crc32c, crc32c};
use colibri_rpc::{BulkArg, BulkKind, Request, RpcConfig, RpcHandle, RpcMachine, Session};
use serde::{Deserialize, Serialize};

use crate::Error;

/// Size of a file: `Name` → `u64`.
pub const OP_STAT: u32 = 0xf11e_0001;
/// Read a range into the client's sink: `ReadReq` + one sink → `u64`
/// bytes read (short at the end of the file).
pub const OP_READ: u32 = 0xf11e_0002;
/// Write the client's source at an offset: `WriteReq` + one source →
/// `u64` bytes written.
pub const OP_WRITE: u32 = 0xf11e_0003;
/// CRC-32C of a whole file: `Name` → `u32`.
pub const OP_SUM: u32 = 0xf11e_0004;

/// Largest range one read or write moves.
pub const MAX_CHUNK: usize = 4 << 20;

/// A file name in the served directory.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Name {
    /// Plain file name (no directories).
    pub name: String,
}

/// A read request.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReadReq {
    /// File name.
    pub name: String,
    /// Where to start.
    pub offset: u64,
    /// Bytes wanted (at most the sink's size).
    pub len: u64,
}

/// A write request (the length is the source buffer's).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WriteReq {
    /// File name.
    pub name: String,
    /// Where to write.
    pub offset: u64,
}

/// Failure codes of the file service (sent as the reply status).
pub mod status {
    /// Bad file name.
    pub const BAD_NAME: i32 = -22;
    /// No such file.
    pub const NOT_FOUND: i32 = -2;
    /// Other I/O error.
    pub const IO: i32 = -5;
    /// Missing or wrong bulk buffer.
    pub const BAD_BULK: i32 = -71;
}

const OPS: [u32; 4] = [OP_STAT, OP_READ, OP_WRITE, OP_SUM];

/// A running file service.
#[derive(Debug)]
pub struct FileServer {
    m: RpcHandle,
}

fn path_in(root: &Path, name: &str) -> Result<PathBuf, i32> {
    let ok = !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\\', '\0']);
    if ok {
        Ok(root.join(name))
    } else {
        Err(status::BAD_NAME)
    }
}

fn io_status(e: &std::io::Error) -> i32 {
    if e.kind() == std::io::ErrorKind::NotFound {
        status::NOT_FOUND
    } else {
        status::IO
    }
}

fn enc<T: Serialize>(v: &T) -> Result<Vec<u8>, i32> {
    colibri_rpc::codec::encode(v).map_err(|e| e.errno())
}

/// Runs one request on a handler pool thread; returns the encoded reply or the
/// failure status.
fn serve_one(m: &RpcHandle, root: &Path, req: &Request) -> Result<Vec<u8>, i32> {
    match req.opcode() {
        OP_STAT => {
            let n: Name = req.decode().map_err(|_| status::BAD_NAME)?;
            let md = std::fs::metadata(path_in(root, &n.name)?).map_err(|e| io_status(&e))?;
            enc(&md.len())
        }
        OP_SUM => {
            let n: Name = req.decode().map_err(|_| status::BAD_NAME)?;
            let mut f = File::open(path_in(root, &n.name)?).map_err(|e| io_status(&e))?;
            let mut c = Crc32c::new();
            let mut buf = vec![0u8; 1 << 20];
            loop {
                let k = f.read(&mut buf).map_err(|e| io_status(&e))?;
                if k == 0 {
                    break;
                }
                c.update(&buf[..k]);
            }
            enc(&c.finish())
        }
        OP_READ => {
            let q: ReadReq = req.decode().map_err(|_| status::BAD_NAME)?;
            let sink = req
                .bulk()
                .first()
                .filter(|d| d.kind == BulkKind::Sink)
                .ok_or(status::BAD_BULK)?;
            let want = q.len.min(sink.len).min(MAX_CHUNK as u64) as usize;
            let mut f = File::open(path_in(root, &q.name)?).map_err(|e| io_status(&e))?;
            f.seek(SeekFrom::Start(q.offset))
                .map_err(|e| io_status(&e))?;
            let mut data = vec![0u8; want];
            let mut got = 0;
            while got < want {
                let k = f.read(&mut data[got..]).map_err(|e| io_status(&e))?;
                if k == 0 {
                    break;
                }
                got += k;
            }
            if got == 0 {
                return enc(&0u64);
            }
            let mut buf = m.alloc(got).map_err(|e| e.errno())?;
            buf.bufvec_mut()
                .copy_in(0, &data[..got])
                .map_err(|_| status::IO)?;
            // Push into the client's sink, then reply: the client's call
            // completes once both the reply and its buffer are back.
            let done = m
                .bulk_push(sink, buf, got)
                .wait()
                .map_err(|b| b.error().errno())?;
            let n = done.result.map_err(|e| e.errno())?;
            enc(&(n as u64))
        }
        OP_WRITE => {
            let q: WriteReq = req.decode().map_err(|_| status::BAD_NAME)?;
            let src = req
                .bulk()
                .first()
                .filter(|d| d.kind == BulkKind::Source)
                .ok_or(status::BAD_BULK)?;
            if src.len > MAX_CHUNK as u64 {
                return Err(status::BAD_BULK);
            }
            let path = path_in(root, &q.name)?;
            let buf = m.alloc(src.len as usize).map_err(|e| e.errno())?;
            let done = m
                .bulk_pull(src, buf)
                .wait()
                .map_err(|b| b.error().errno())?;
            let n = done.result.map_err(|e| e.errno())?;
            let data = done.buffer.bufvec().to_vec(0, n).map_err(|_| status::IO)?;
            let mut f = OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
                .map_err(|e| io_status(&e))?;
            f.seek(SeekFrom::Start(q.offset))
                .map_err(|e| io_status(&e))?;
            f.write_all(&data).map_err(|e| io_status(&e))?;
            enc(&(n as u64))
        }
        _ => Err(colibri_rpc::STATUS_UNKNOWN_OPCODE),
    }
}

impl FileServer {
    /// Serves the files of `root` on machine `m`. The handlers run on the
    /// machine's handler pool ([`RpcHandle::on_blocking`], sized by
    /// [`RpcConfig::handler_threads`]), where they may wait for the disk
    /// and for their bulk transfers.
    ///
    /// # Errors
    /// The machine is shutting down, or the pool's threads could not be
    /// started.
    pub fn start(m: &RpcHandle, root: &Path) -> Result<Self, Error> {
        for op in OPS {
            let (h, root) = (m.clone(), root.to_path_buf());
            m.on_blocking(op, move |req, reply| match serve_one(&h, &root, &req) {
                Ok(bytes) => reply.ok(&bytes),
                Err(code) => reply.error(code),
            })?;
        }
        Ok(Self { m: m.clone() })
    }

    /// Unregisters the handlers (requests still running finish).
    pub fn stop(self) {
        for op in OPS {
            self.m.remove_handler(op);
        }
    }
}

/// A client of the file service.
#[derive(Debug)]
pub struct FileClient {
    session: Session,
    machine: RpcHandle,
    chunk: usize,
}

impl FileClient {
    /// A client over `session` (of machine `machine`), moving `chunk`
    /// bytes per call.
    pub fn new(machine: RpcHandle, session: Session, chunk: usize) -> Self {
        Self {
            session,
            machine,
            chunk: chunk.clamp(1, MAX_CHUNK),
        }
    }

    /// Size of a remote file.
    ///
    /// # Errors
    /// The call's failure.
    pub fn stat(&self, name: &str) -> Result<u64, Error> {
        Ok(self
            .session
            .call_typed(OP_STAT, &Name { name: name.into() })?)
    }

    /// CRC-32C of a remote file.
    ///
    /// # Errors
    /// The call's failure.
    pub fn checksum(&self, name: &str) -> Result<u32, Error> {
        Ok(self
            .session
            .call_typed(OP_SUM, &Name { name: name.into() })?)
    }

    /// Copies a local file to the server; returns the bytes sent.
    ///
    /// # Errors
    /// Local I/O, or a call's failure.
    pub fn upload(&self, local: &Path, name: &str) -> Result<u64, Error> {
        let mut f = File::open(local)?;
        let mut buf = Some(self.machine.alloc(self.chunk)?);
        let mut data = vec![0u8; self.chunk];
        let mut offset = 0u64;
        loop {
            let k = f.read(&mut data)?;
            if k == 0 {
                break;
            }
            let mut b = buf.take().ok_or("bulk buffer lost")?;
            b.bufvec_mut().copy_in(0, &data[..k])?;
            let req = colibri_rpc::codec::encode(&WriteReq {
                name: name.into(),
                offset,
            })?;
            let out =
                self.session
                    .call_bulk(OP_WRITE, &req, vec![BulkArg::Source { buf: b, len: k }]);
            buf = out.buffers.into_iter().next().map(|d| d.buffer);
            let n: u64 = colibri_rpc::codec::decode(&out.result?)?;
            if n != k as u64 {
                return Err(format!("server wrote {n} of {k} bytes at {offset}").into());
            }
            offset += n;
        }
        if offset == 0 {
            // An empty file: create it with an empty write of nothing.
            return Err("empty files are not supported by this example".into());
        }
        Ok(offset)
    }

    /// Copies a remote file into a local one; returns the bytes received.
    ///
    /// # Errors
    /// Local I/O, or a call's failure.
    pub fn download(&self, name: &str, local: &Path) -> Result<u64, Error> {
        let size = self.stat(name)?;
        let mut f = File::create(local)?;
        let mut buf = Some(self.machine.alloc(self.chunk)?);
        let mut offset = 0u64;
        while offset < size {
            let b = buf.take().ok_or("bulk buffer lost")?;
            let req = colibri_rpc::codec::encode(&ReadReq {
                name: name.into(),
                offset,
                len: self.chunk as u64,
            })?;
            let out = self
                .session
                .call_bulk(OP_READ, &req, vec![BulkArg::Sink { buf: b }]);
            let back = out.buffers.into_iter().next().map(|d| d.buffer);
            let n: u64 = colibri_rpc::codec::decode(&out.result?)?;
            let b = back.ok_or("bulk buffer lost")?;
            if n == 0 {
                return Err(format!("file shrank to {offset} bytes while reading").into());
            }
            f.write_all(&b.bufvec().to_vec(0, n as usize)?)?;
            buf = Some(b);
            offset += n;
        }
        f.sync_all()?;
        Ok(offset)
    }
}

/// What [`run_local`] did.
#[derive(Debug, Clone)]
pub struct Report {
    /// Bytes copied each way.
    pub bytes: u64,
    /// CRC-32C of the source.
    pub source_sum: u32,
    /// CRC-32C the server computed of its copy.
    pub remote_sum: u32,
    /// CRC-32C of the file copied back.
    pub copy_sum: u32,
    /// All three agree and the copy equals the source.
    pub verified: bool,
}

fn file_sum(p: &Path) -> Result<u32, Error> {
    Ok(crc32c(&std::fs::read(p)?))
}

/// Copies `src` to `dst` through a file server in this process: uploads
/// `src` to a server rooted in `work`, downloads it into `dst`, and checks
/// the checksums.
///
/// # Errors
/// Any failure.
pub fn copy_through_server(
    xprt: &dyn Transport,
    work: &Path,
    src: &Path,
    dst: &Path,
) -> Result<Report, Error> {
    let root = work.join("served");
    std::fs::create_dir_all(&root)?;
    let server = RpcMachine::start_on(xprt, "127.0.0.1:0:1", RpcConfig::default())?;
    let files = FileServer::start(&server, &root)?;
    let client = RpcMachine::start_on(xprt, "127.0.0.1:0:2", RpcConfig::default())?;
    let fc = FileClient::new(client.handle(), client.session(server.addr())?, 1 << 20);
    let result = (|| -> Result<Report, Error> {
        let name = "copy.bin";
        let up = fc.upload(src, name)?;
        let down = fc.download(name, dst)?;
        if up != down {
            return Err(format!("uploaded {up} bytes, downloaded {down}").into());
        }
        let source_sum = file_sum(src)?;
        let remote_sum = fc.checksum(name)?;
        let copy_sum = file_sum(dst)?;
        let same = std::fs::read(src)? == std::fs::read(dst)?;
        Ok(Report {
            bytes: up,
            source_sum,
            remote_sum,
            copy_sum,
            verified: same && source_sum == remote_sum && remote_sum == copy_sum,
        })
    })();
    drop(fc);
    client.shutdown()?;
    server.shutdown()?;
    files.stop();
    result
}

/// Makes a `size`-byte file of varied content in `work`, copies it through
/// a server, and checks it.
///
/// # Errors
/// Any failure.
pub fn run_local(xprt: &dyn Transport, work: &Path, size: usize) -> Result<Report, Error> {
    std::fs::create_dir_all(work)?;
    let src = work.join("source.bin");
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let data: Vec<u8> = (0..size)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    std::fs::write(&src, &data)?;
    copy_through_server(xprt, work, &src, &work.join("copy.bin"))
}
