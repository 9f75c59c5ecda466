//! Opening the store: the file (or memory) it lives in, every table created so that read
//! transactions can open them, and an older schema's rows moved forward.

use std::path::Path;

use redb::backends::InMemoryBackend;
use redb::{Database, ReadableTable};

use super::db::{
    EVENTS, HOSTS, LEASE_REQUEST_IDS, LEASES, META, PLACEMENTS, POOLS, Result, SCHEMA_VERSION,
    SCHEMA_VERSION_KEY, Store, StoreError, VMS,
};
use super::pool_vms;

/// The store's file name inside `BatteryConfig::data_dir`.
const FILE_NAME: &str = "battery.redb";

impl Store {
    /// Opens the store in `data_dir` (created if needed), or in memory when `None`.
    pub(crate) fn open(data_dir: Option<&Path>) -> Result<Self> {
        let db = match data_dir {
            Some(dir) => {
                std::fs::create_dir_all(dir).map_err(|source| StoreError::DataDir {
                    path: dir.to_path_buf(),
                    source,
                })?;
                Database::create(dir.join(FILE_NAME))?
            }
            None => Database::builder().create_with_backend(InMemoryBackend::new())?,
        };
        let txn = db.begin_write()?;
        {
            let mut meta = txn.open_table(META)?;
            let found = meta.get(SCHEMA_VERSION_KEY)?.map(|v| v.value());
            match found {
                Some(found) if found > SCHEMA_VERSION => return Err(StoreError::TooNew { found }),
                Some(SCHEMA_VERSION) => {}
                Some(_) => {
                    pool_vms::rebuild(&txn)?;
                    meta.insert(SCHEMA_VERSION_KEY, SCHEMA_VERSION)?;
                }
                None => {
                    meta.insert(SCHEMA_VERSION_KEY, SCHEMA_VERSION)?;
                }
            }
            // Create every table so read transactions can open them.
            txn.open_table(POOLS)?;
            txn.open_table(VMS)?;
            txn.open_table(pool_vms::POOL_VMS)?;
            txn.open_table(LEASES)?;
            txn.open_table(LEASE_REQUEST_IDS)?;
            txn.open_table(EVENTS)?;
            txn.open_table(HOSTS)?;
            txn.open_table(PLACEMENTS)?;
        }
        txn.commit()?;
        Self::new(db)
    }
}
