//! A small line diff for mismatch reports (longest common subsequence; falls back to both texts when huge).

/// Lines of `golden` missing from `got` are prefixed `-`, lines only in `got` `+`, common lines ` `. Runs of more
/// than three common lines are elided.
pub(crate) fn line_diff(golden: &str, got: &str) -> String {
    let a: Vec<&str> = golden.lines().collect();
    let b: Vec<&str> = got.lines().collect();
    const MAX_CELLS: usize = 4_000_000;
    if a.len().saturating_mul(b.len()) > MAX_CELLS {
        return format!("--- golden\n{golden}\n+++ got\n{got}");
    }
    // lcs[i][j]: length of the longest common subsequence of a[i..] and b[j..].
    let mut lcs = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let mut lines: Vec<(char, &str)> = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            lines.push((' ', a[i]));
            i += 1;
            j += 1;
        } else if i < a.len() && (j == b.len() || lcs[i + 1][j] >= lcs[i][j + 1]) {
            lines.push(('-', a[i]));
            i += 1;
        } else {
            lines.push(('+', b[j]));
            j += 1;
        }
    }
    render(&lines)
}

fn render(lines: &[(char, &str)]) -> String {
    const CONTEXT: usize = 3;
    let changed: Vec<bool> = lines.iter().map(|(c, _)| *c != ' ').collect();
    let near_change = |idx: usize| {
        let lo = idx.saturating_sub(CONTEXT);
        let hi = (idx + CONTEXT + 1).min(lines.len());
        changed[lo..hi].iter().any(|c| *c)
    };
    let mut out = String::new();
    let mut elided = false;
    for (idx, (tag, line)) in lines.iter().enumerate() {
        if near_change(idx) {
            out.push(*tag);
            out.push_str(line);
            out.push('\n');
            elided = false;
        } else if !elided {
            out.push_str(" ...\n");
            elided = true;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_removed_and_added_lines() {
        let d = line_diff("a\nb\nc\n", "a\nx\nc\n");
        assert_eq!(d, " a\n-b\n+x\n c\n");
    }

    #[test]
    fn elides_long_common_runs() {
        let golden: String = (0..20).map(|i| format!("l{i}\n")).collect();
        let got = golden.replace("l10\n", "changed\n");
        let d = line_diff(&golden, &got);
        assert!(d.starts_with(" ...\n l7\n"), "{d}");
        assert!(d.contains("-l10\n+changed\n"), "{d}");
        assert!(d.ends_with(" l13\n ...\n"), "{d}");
    }
}
