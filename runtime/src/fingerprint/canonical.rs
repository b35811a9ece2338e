//! The canonical form of a JSON text, which a [`Fingerprint`](super::Fingerprint) hashes: compact,
//! the members of every object sorted, numbers and strings kept as their exact text.

/// How deep [`Fingerprint::of_json`] follows arrays and objects in text from outside (a request
/// body), so that such text cannot exhaust the stack: deeper text is not JSON to it, as it is
/// not to `serde_json`'s parser, whose limit is about the same.
pub(super) const MAX_DEPTH: usize = 128;

/// Input: JSON text. Output: its canonical form ([`Fingerprint::of_json`] says what that is),
/// written to a buffer that is returned; `None` when the text is not one JSON value or is
/// nested deeper than `max_depth`.
///
/// One pass over the text, building no tree: the output grows in one buffer, each object's
/// members are written where they come and reordered in place when they are not in order,
/// through one scratch buffer and one list of member spans shared by all objects.
pub(super) fn canonical(text: &[u8], max_depth: usize) -> Option<Vec<u8>> {
    // UTF-8 checked once, up front: the strings' bytes are then copied as they are.
    std::str::from_utf8(text).ok()?;
    let mut canonical = Canonical {
        text,
        at: 0,
        // Never longer than the text: dropping whitespace, decoding escapes and respelling
        // exponents only shorten it.
        out: Vec::with_capacity(text.len()),
        members: Vec::new(),
        scratch: Vec::new(),
        depth_left: max_depth,
    };
    canonical.whitespace();
    canonical.value()?;
    canonical.whitespace();
    (canonical.at == text.len()).then_some(canonical.out)
}

/// Where one object member sits in the output: its name (quoted) at `start..name_end`, then `:`
/// and its value up to `end`.
#[derive(Clone, Copy)]
struct Member {
    start: usize,
    name_end: usize,
    end: usize,
}

struct Canonical<'a> {
    text: &'a [u8],
    at: usize,
    out: Vec<u8>,
    /// The members of every object being written, innermost last.
    members: Vec<Member>,
    scratch: Vec<u8>,
    depth_left: usize,
}

impl Canonical<'_> {
    fn peek(&self) -> Option<u8> {
        self.text.get(self.at).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let byte = self.peek()?;
        self.at += 1;
        Some(byte)
    }

    fn whitespace(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        let end = self.at + word.len();
        (self.text.get(self.at..end)? == word).then_some(())?;
        self.out.extend_from_slice(word);
        self.at = end;
        Some(())
    }

    fn value(&mut self) -> Option<()> {
        match self.peek()? {
            b'{' => self.nested(Self::object),
            b'[' => self.nested(Self::array),
            b'"' => self.string(),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            b'-' | b'0'..=b'9' => self.number(),
            _ => None,
        }
    }

    fn nested(&mut self, container: fn(&mut Self) -> Option<()>) -> Option<()> {
        self.depth_left = self.depth_left.checked_sub(1)?;
        container(self)?;
        self.depth_left += 1;
        Some(())
    }

    /// Writes the `open` bracket read; `true` when `close` follows at once, which is then
    /// written too.
    fn opens_empty(&mut self, open: u8, close: u8) -> Option<bool> {
        self.at += 1;
        self.out.push(open);
        self.whitespace();
        let empty = self.peek()? == close;
        if empty {
            self.at += 1;
            self.out.push(close);
        }
        Some(empty)
    }

    /// After an item: `true` on a comma (written), `false` on `close` (not yet written).
    fn another(&mut self, close: u8) -> Option<bool> {
        self.whitespace();
        match self.next()? {
            b',' => {
                self.out.push(b',');
                Some(true)
            }
            byte => (byte == close).then_some(false),
        }
    }

    fn array(&mut self) -> Option<()> {
        if self.opens_empty(b'[', b']')? {
            return Some(());
        }
        loop {
            self.whitespace();
            self.value()?;
            if !self.another(b']')? {
                break;
            }
        }
        self.out.push(b']');
        Some(())
    }

    /// Members sorted by their names' bytes (as decoded); members with equal names keep their
    /// order, and all of them count: readers disagree on which of two equal names wins.
    fn object(&mut self) -> Option<()> {
        if self.opens_empty(b'{', b'}')? {
            return Some(());
        }
        let region = self.out.len();
        let first = self.members.len();
        loop {
            self.whitespace();
            if self.peek()? != b'"' {
                return None;
            }
            let start = self.out.len();
            self.string()?;
            let name_end = self.out.len();
            self.whitespace();
            if self.next()? != b':' {
                return None;
            }
            self.out.push(b':');
            self.whitespace();
            self.value()?;
            let end = self.out.len();
            self.members.push(Member {
                start,
                name_end,
                end,
            });
            if !self.another(b'}')? {
                break;
            }
        }
        let out = &self.out;
        let members = &mut self.members[first..];
        let name = |member: &Member| decoded(&out[member.start + 1..member.name_end - 1]);
        if !members.is_sorted_by(|a, b| name(a).le(name(b))) {
            // Unstable but deterministic: equal names are ordered by where they came.
            members.sort_unstable_by(|a, b| name(a).cmp(name(b)).then(a.start.cmp(&b.start)));
            self.scratch.clear();
            self.scratch.extend_from_slice(&self.out[region..]);
            self.out.truncate(region);
            for (index, member) in members.iter().enumerate() {
                if index > 0 {
                    self.out.push(b',');
                }
                let from = member.start - region;
                self.out
                    .extend_from_slice(&self.scratch[from..member.end - region]);
            }
        }
        self.members.truncate(first);
        self.out.push(b'}');
        Some(())
    }

    /// A string, written as `serde_json` writes one: `"` and `\\` escaped, the control
    /// characters as `\b`, `\t`, `\n`, `\f`, `\r` or `\u00xx`, everything else as itself.
    fn string(&mut self) -> Option<()> {
        self.at += 1;
        self.out.push(b'"');
        loop {
            let run = self.text[self.at..]
                .iter()
                .position(|&byte| byte == b'"' || byte == b'\\' || byte < 0x20)?;
            self.out
                .extend_from_slice(&self.text[self.at..self.at + run]);
            self.at += run;
            match self.next()? {
                b'"' => break,
                b'\\' => {
                    let unescaped = match self.next()? {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => self.escaped_char()?,
                        _ => return None,
                    };
                    write_char(&mut self.out, unescaped);
                }
                // A raw control character.
                _ => return None,
            }
        }
        self.out.push(b'"');
        Some(())
    }

    /// The character of a `\u` escape (whose `\u` is read), a surrogate pair's as one; a lone
    /// surrogate is not JSON to `serde_json`, nor here.
    fn escaped_char(&mut self) -> Option<char> {
        let high = self.hex4()?;
        if !(0xd800..0xdc00).contains(&high) {
            return char::from_u32(high);
        }
        if self.next()? != b'\\' || self.next()? != b'u' {
            return None;
        }
        let low = self.hex4()?;
        if !(0xdc00..0xe000).contains(&low) {
            return None;
        }
        char::from_u32(0x1_0000 + ((high - 0xd800) << 10) + (low - 0xdc00))
    }

    fn hex4(&mut self) -> Option<u32> {
        let digits = self.text.get(self.at..self.at + 4)?;
        let mut value = 0;
        for &digit in digits {
            value = value * 16 + char::from(digit).to_digit(16)?;
        }
        self.at += 4;
        Some(value)
    }

    /// A number, as its text: only the exponent's spelling is normalised (`E` as `e`, no `+`,
    /// no leading zeros), which no reader tells apart.
    fn number(&mut self) -> Option<()> {
        let start = self.at;
        if self.peek() == Some(b'-') {
            self.at += 1;
        }
        match self.next()? {
            b'0' => {}
            b'1'..=b'9' => self.digits(),
            _ => return None,
        }
        if self.peek() == Some(b'.') {
            self.at += 1;
            self.some_digits()?;
        }
        self.out.extend_from_slice(&self.text[start..self.at]);
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.at += 1;
            let negative = match self.peek() {
                Some(sign @ (b'-' | b'+')) => {
                    self.at += 1;
                    sign == b'-'
                }
                _ => false,
            };
            let digits = self.at;
            self.some_digits()?;
            let exponent = &self.text[digits..self.at];
            self.out.push(b'e');
            match exponent.iter().position(|&digit| digit != b'0') {
                Some(first) => {
                    if negative {
                        self.out.push(b'-');
                    }
                    self.out.extend_from_slice(&exponent[first..]);
                }
                None => self.out.push(b'0'),
            }
        }
        Some(())
    }

    fn digits(&mut self) {
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.at += 1;
        }
    }

    fn some_digits(&mut self) -> Option<()> {
        let start = self.at;
        self.digits();
        (self.at > start).then_some(())
    }
}

/// Input: the inside of a string as [`Canonical`] writes it. Output: the bytes of the string it
/// stands for, for sorting names as `serde_json`'s map sorts them.
fn decoded(written: &[u8]) -> impl Iterator<Item = u8> + '_ {
    let mut bytes = written.iter().copied();
    std::iter::from_fn(move || {
        let byte = bytes.next()?;
        if byte != b'\\' {
            return Some(byte);
        }
        Some(match bytes.next()? {
            b'b' => 0x08,
            b'f' => 0x0c,
            b'n' => b'\n',
            b'r' => b'\r',
            b't' => b'\t',
            // `\u00xx`: a control character.
            b'u' => {
                let digits: [u8; 4] = std::array::from_fn(|_| bytes.next().unwrap_or(b'0'));
                // Lower-case hex digits, as `write_char` writes them.
                let hex = |digit: u8| match digit {
                    b'0'..=b'9' => digit - b'0',
                    b'a'..=b'f' => digit - b'a' + 10,
                    _ => 0,
                };
                hex(digits[2]) << 4 | hex(digits[3])
            }
            // `\"` and `\\`.
            escaped => escaped,
        })
    })
}

/// Writes `c` inside a string as `serde_json` does.
fn write_char(out: &mut Vec<u8>, c: char) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    match c {
        '"' => out.extend_from_slice(b"\\\""),
        '\\' => out.extend_from_slice(b"\\\\"),
        '\u{8}' => out.extend_from_slice(b"\\b"),
        '\u{c}' => out.extend_from_slice(b"\\f"),
        '\n' => out.extend_from_slice(b"\\n"),
        '\r' => out.extend_from_slice(b"\\r"),
        '\t' => out.extend_from_slice(b"\\t"),
        '\0'..='\u{1f}' => {
            let byte = c as u8;
            out.extend_from_slice(b"\\u00");
            out.push(DIGITS[usize::from(byte >> 4)]);
            out.push(DIGITS[usize::from(byte & 0x0f)]);
        }
        _ => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
    }
}
