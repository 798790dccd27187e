//! placeholder while fetching
