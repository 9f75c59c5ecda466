//! `string_enum!`: an enumerated string field that keeps values it does not know.
//!
//! Go API types declare enums as `type X string` with constants, so an unknown value decodes
//! and validation answers `422 Unsupported value: "x": supported values: ...`. A plain Rust
//! enum would fail in the decoder instead (a `400` that names no field), and an SDK reading
//! a value added by a newer server would fail to decode the whole object. So each enum here
//! has an `Unknown(String)` variant, decodes from and encodes to its wire string, and
//! publishes only the known values in its schema.

/// Declares an enumerated string type: the listed variants, each with its wire value, plus
/// `Unknown(String)`, and `VALUES`, `as_str`, `is_known`, `From<&str>`, `Display`, serde
/// and `JsonSchema` (a string with an `enum` of the known values).
macro_rules! string_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $( $(#[$variant_meta:meta])* $variant:ident = $wire:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash)]
        $vis enum $name {
            $( $(#[$variant_meta])* $variant, )+
            /// A value this version does not know. It is kept rather than refused by the
            /// decoder, so that validation can name it (`Unsupported value`) and values a
            /// newer server adds do not stop older clients reading the object.
            Unknown(String),
        }

        impl $name {
            /// The values this version knows, as written on the wire.
            pub const VALUES: &'static [&'static str] = &[$($wire),+];

            /// The value as written on the wire.
            pub fn as_str(&self) -> &str {
                match self {
                    $( Self::$variant => $wire, )+
                    Self::Unknown(value) => value,
                }
            }

            /// Whether this version knows the value (it is not `Unknown`).
            pub fn is_known(&self) -> bool {
                !matches!(self, Self::Unknown(_))
            }
        }

        impl From<&str> for $name {
            fn from(value: &str) -> Self {
                match value {
                    $( $wire => Self::$variant, )+
                    other => Self::Unknown(other.to_owned()),
                }
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl ::serde::Serialize for $name {
            fn serialize<S: ::serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        impl<'de> ::serde::Deserialize<'de> for $name {
            fn deserialize<D: ::serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let value = <String as ::serde::Deserialize>::deserialize(deserializer)?;
                Ok(Self::from(value.as_str()))
            }
        }

        impl ::schemars::JsonSchema for $name {
            fn schema_name() -> ::std::borrow::Cow<'static, str> {
                stringify!($name).into()
            }

            fn json_schema(_: &mut ::schemars::SchemaGenerator) -> ::schemars::Schema {
                ::schemars::json_schema!({ "type": "string", "enum": Self::VALUES })
            }
        }
    };
}

pub(crate) use string_enum;
