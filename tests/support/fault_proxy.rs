//! [`FaultProxy`]: a TCP proxy for fault tests, put between a client and one service member. It forwards both ways
//! until told otherwise:
//!
//! - [`Fault::Blackhole`]: accepts connections and reads what arrives, but forwards nothing either way (a member
//!   that is cut off or hung: requests are never answered, and no error says so).
//! - [`Fault::Delay`]: forwards every chunk after a delay.
//! - [`Fault::Drop`]: closes every open connection and every new one at once (a member that went down).
//! - [`Fault::None`]: heals. Connections made from then on work; one that was blackholed forwards again but has
//!   lost bytes, so its client finds it broken and reconnects, as after a real partition.
//!
//! Shared by the library's tests and walctl's (`#[path]`); plain threads, so it serves sync and async tests alike.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the proxy does to traffic now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Forward.
    None,
    /// Swallow everything, answer nothing.
    Blackhole,
    /// Forward each chunk this late.
    Delay(Duration),
    /// Close every connection.
    Drop,
}

struct Shared {
    fault: Mutex<Fault>,
    stopped: AtomicBool,
    /// Every socket opened (both sides), to close them on `Drop` and when the proxy goes away.
    sockets: Mutex<Vec<TcpStream>>,
}

impl Shared {
    fn fault(&self) -> Fault {
        *self.fault.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn keep(&self, socket: &TcpStream) {
        if let Ok(clone) = socket.try_clone() {
            self.sockets
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(clone);
        }
    }

    fn close_all(&self) {
        for socket in self
            .sockets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            let _ = socket.shutdown(Shutdown::Both);
        }
    }
}

/// A proxy on a free loopback port in front of `target`.
pub struct FaultProxy {
    address: String,
    target: String,
    shared: Arc<Shared>,
}

impl FaultProxy {
    /// Starts forwarding to `target` (`host:port`).
    pub fn start(target: &str) -> FaultProxy {
        let listener =
            TcpListener::bind("127.0.0.1:0").expect("bind a loopback port for the proxy");
        let address = listener
            .local_addr()
            .expect("the proxy's address")
            .to_string();
        let shared = Arc::new(Shared {
            fault: Mutex::new(Fault::None),
            stopped: AtomicBool::new(false),
            sockets: Mutex::new(Vec::new()),
        });
        let accepting = shared.clone();
        let to = target.to_string();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if accepting.stopped.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(client) = client else { continue };
                let _ = client.set_nodelay(true);
                accepting.keep(&client);
                match accepting.fault() {
                    Fault::Drop => {
                        let _ = client.shutdown(Shutdown::Both);
                    }
                    Fault::Blackhole => {
                        // Accepted and read, never answered.
                        let shared = accepting.clone();
                        std::thread::spawn(move || swallow(client, &shared));
                    }
                    Fault::None | Fault::Delay(_) => {
                        let Ok(server) = TcpStream::connect(&to) else {
                            let _ = client.shutdown(Shutdown::Both);
                            continue;
                        };
                        let _ = server.set_nodelay(true);
                        accepting.keep(&server);
                        let (Ok(client2), Ok(server2)) = (client.try_clone(), server.try_clone())
                        else {
                            continue;
                        };
                        let up = accepting.clone();
                        let down = accepting.clone();
                        std::thread::spawn(move || pump(client, server, &up));
                        std::thread::spawn(move || pump(server2, client2, &down));
                    }
                }
            }
        });
        FaultProxy {
            address,
            target: target.to_string(),
            shared,
        }
    }

    /// `127.0.0.1:port` to connect to instead of the target.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// The member behind it.
    pub fn target(&self) -> &str {
        &self.target
    }

    /// Applies `fault` from now on (to open connections too).
    pub fn set(&self, fault: Fault) {
        *self.shared.fault.lock().unwrap_or_else(|e| e.into_inner()) = fault;
        if fault == Fault::Drop {
            self.shared.close_all();
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shared.stopped.store(true, Ordering::Relaxed);
        self.shared.close_all();
        // Wake the accept loop so it sees `stopped`.
        let _ = TcpStream::connect(&self.address);
    }
}

/// Copies `from` to `to` chunk by chunk, as the fault in force says.
fn pump(mut from: TcpStream, mut to: TcpStream, shared: &Shared) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        match shared.fault() {
            Fault::None => {}
            Fault::Blackhole => continue,
            Fault::Delay(d) => std::thread::sleep(d),
            Fault::Drop => break,
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
    let _ = from.shutdown(Shutdown::Read);
}

/// Reads and discards until the peer closes.
fn swallow(mut socket: TcpStream, shared: &Shared) {
    let mut buf = vec![0u8; 64 * 1024];
    while !shared.stopped.load(Ordering::Relaxed) {
        match socket.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}
