//! "Did you mean …?" for misspelt option and parameter names.

/// The candidate closest to `typo`, if it is close enough to be what was meant.
pub(crate) fn did_you_mean<'a>(
    typo: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    let limit = (typo.chars().count() / 3).max(1);
    candidates
        .into_iter()
        .map(|candidate| (edit_distance(typo, candidate), candidate))
        .filter(|(distance, _)| *distance <= limit)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, candidate)| candidate)
}

/// Levenshtein distance over characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitution = diagonal + usize::from(ca != *cb);
            diagonal = row[j + 1];
            row[j + 1] = substitution.min(row[j] + 1).min(row[j + 1] + 1);
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_near_misses_only() {
        let params = ["order_id", "amount_cents"];
        assert_eq!(did_you_mean("orderid", params), Some("order_id"));
        assert_eq!(did_you_mean("order_ids", params), Some("order_id"));
        assert_eq!(did_you_mean("customer", params), None);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }
}
