//! A request's split into passes of whole images under the patch ceiling.

use std::ops::Range;

use crate::tower_error::InputError;

/// Splits images of `patches` each into consecutive passes of at most `ceiling` patches; one
/// (empty) pass for no images, so the tower gives its own answer.
pub(crate) fn pass_ranges(
    patches: &[usize],
    ceiling: usize,
) -> Result<Vec<Range<usize>>, InputError> {
    let mut passes = Vec::new();
    let (mut start, mut sum) = (0, 0usize);
    for (index, &p) in patches.iter().enumerate() {
        if p > ceiling {
            return Err(InputError::OverCeiling {
                index,
                patches: p,
                ceiling,
            });
        }
        if sum.checked_add(p).is_none_or(|s| s > ceiling) {
            passes.push(start..index);
            (start, sum) = (index, 0);
        }
        sum += p;
    }
    passes.push(start..patches.len());
    Ok(passes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passes_hold_whole_images_in_order_under_the_ceiling() {
        let r = |p: &[usize], c| match pass_ranges(p, c) {
            Ok(v) => Ok(v.into_iter().map(|r| (r.start, r.end)).collect::<Vec<_>>()),
            Err(e) => Err(format!("{e:?}")),
        };
        assert_eq!(r(&[], 10), Ok(vec![(0, 0)]));
        assert_eq!(r(&[4, 4, 2], 10), Ok(vec![(0, 3)]));
        assert_eq!(r(&[4, 4, 3], 10), Ok(vec![(0, 2), (2, 3)]));
        assert_eq!(r(&[10, 1, 9, 10], 10), Ok(vec![(0, 1), (1, 3), (3, 4)]));
        assert_eq!(r(&[1, 1, 1], 1), Ok(vec![(0, 1), (1, 2), (2, 3)]));
        assert!(matches!(
            pass_ranges(&[3, 11, 2], 10),
            Err(InputError::OverCeiling {
                index: 1,
                patches: 11,
                ceiling: 10
            })
        ));
        assert_eq!(r(&[usize::MAX, 1], usize::MAX), Ok(vec![(0, 1), (1, 2)]));
    }
}
