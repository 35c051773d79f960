//! Plain-text tables for the status commands: each column as wide as its widest cell, so a
//! long name or address widens its column instead of pushing the rest of its row out of line.

/// A table of text cells under a heading, columns left- or right-aligned.
pub(crate) struct Table {
    heads: Vec<&'static str>,
    /// Right-aligned (numbers), per column.
    right: Vec<bool>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// Columns by heading; a heading starting with '>' is right-aligned (the '>' not shown).
    pub(crate) fn new(heads: &[&'static str]) -> Self {
        let right = heads.iter().map(|h| h.starts_with('>')).collect();
        let heads = heads.iter().map(|h| h.trim_start_matches('>')).collect();
        Self { heads, right, rows: Vec::new() }
    }

    pub(crate) fn row(&mut self, cells: Vec<String>) {
        debug_assert_eq!(cells.len(), self.heads.len(), "one cell per column");
        self.rows.push(cells);
    }

    /// The heading and the rows, one line each, columns two spaces apart.
    pub(crate) fn render(&self) -> String {
        let mut widths: Vec<usize> = self.heads.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let line = |cells: &mut dyn Iterator<Item = &str>| {
            let mut out = String::new();
            for (i, cell) in cells.enumerate() {
                let pad = " ".repeat(widths[i] - cell.chars().count());
                if i > 0 {
                    out.push_str("  ");
                }
                if self.right[i] {
                    out.push_str(&pad);
                    out.push_str(cell);
                } else {
                    out.push_str(cell);
                    out.push_str(&pad);
                }
            }
            out.truncate(out.trim_end().len());
            out.push('\n');
            out
        };
        let mut out = line(&mut self.heads.iter().copied());
        for row in &self.rows {
            out.push_str(&line(&mut row.iter().map(String::as_str)));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_widen_to_their_longest_cell_and_numbers_align_right() {
        let mut t = Table::new(&["NAME", ">BLOCKS"]);
        t.row(vec!["a-rather-long-data-set-name".into(), "7".into()]);
        t.row(vec!["x".into(), "12345678".into()]);
        assert_eq!(
            t.render(),
            "NAME                           BLOCKS\n\
             a-rather-long-data-set-name         7\n\
             x                            12345678\n"
        );
    }
}
