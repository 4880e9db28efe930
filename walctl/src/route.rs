//! Where a table's regions lead: asked of the `walctl serve` servers (`--server`), or read from the metadata store
//! of the config (embedded). What `load`, `wal flush` and `region dump` route by.

use std::time::Duration;

use remote_wal::config::MetasrvConfig;
use remote_wal::kv::redb::RedbOpenMode;
use remote_wal::metasrv::datanodes::TableLeaders;
use remote_wal::metasrv::{Metasrv, parse_table_name};

use crate::Failure;
use crate::client::Client;

/// Reads a table's region leaders, again and again (a leader moves, a datanode registers anew).
pub enum Router {
    /// Through the servers.
    Servers(Client),
    /// From the store, in this process.
    Embedded {
        /// The metasrv (no manager started: nothing is claimed or written).
        metasrv: Box<Metasrv>,
        /// The runtime to read on.
        runtime: tokio::runtime::Handle,
    },
}

impl Router {
    /// Through `servers` (with `access`'s token and authority) when given, else on the store of `config`.
    pub async fn new(
        servers: &[String],
        config: Option<&std::path::Path>,
        wait: Duration,
        access: &crate::access::Access,
    ) -> Result<Self, Failure> {
        if !servers.is_empty() {
            return Ok(Router::Servers(Client::new(servers, wait, access)?));
        }
        let config = match config {
            Some(path) => MetasrvConfig::from_file(path)?,
            None => MetasrvConfig::embedded(),
        };
        let metasrv = Metasrv::open(config, RedbOpenMode::MustExist).await?;
        Ok(Router::Embedded {
            metasrv: Box::new(metasrv),
            runtime: tokio::runtime::Handle::current(),
        })
    }

    /// The table's regions and their leaders now (blocking; call it off the runtime's workers or in
    /// `block_in_place`).
    pub fn table(&mut self, name: &str) -> Result<TableLeaders, Failure> {
        match self {
            Router::Servers(client) => client.table_leaders(name),
            Router::Embedded { metasrv, runtime } => {
                let name = parse_table_name(name)?;
                Ok(runtime.block_on(metasrv.table_leaders(&name))?)
            }
        }
    }

    /// Stops the embedded metasrv.
    pub async fn close(self) -> Result<(), Failure> {
        if let Router::Embedded { metasrv, .. } = self {
            metasrv.stop().await?;
        }
        Ok(())
    }
}
