//! What a datanode opens: `DatanodeTableValue` → `RegionOpenRequest`.
