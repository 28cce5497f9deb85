//! The file as written: the types of the `ratewarden-schema` crate (a
//! crate of its own for the build's time; see there).
//! [`super::validate`] turns them into a [`super::Config`].

pub(crate) use ratewarden_schema::*;
