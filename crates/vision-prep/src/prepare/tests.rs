//! Tests of `prepare.rs`.

use super::*;

#[test]
fn grid_rows_are_sizes_or_nothing() {
    assert_eq!(grid_row(&[2, 4, 6]), Some([2, 4, 6]));
    assert_eq!(grid_row(&[1, -4, 6]), None);
    assert_eq!(grid_row(&[1, 4]), None);
}

#[test]
fn a_step_view_side_comes_from_a_square_shape_only() {
    assert_eq!(square_side(&[1, 3, 728, 728], 1), Some(728));
    assert_eq!(square_side(&[2, 3, 504, 504], 2), Some(504));
    assert_eq!(square_side(&[2, 3, 504, 504], 3), None);
    assert_eq!(square_side(&[1, 3, 728, 727], 1), None);
    assert_eq!(square_side(&[1, 4, 728, 728], 1), None);
    assert_eq!(square_side(&[3, 728, 728], 1), None);
}

#[test]
fn step_crops_split_the_local_tensor_in_order() {
    let local: Vec<f32> = (0..2 * 3 * 4).map(|i| i as f32).collect();
    let tensor = |name: &'static str, shape: Vec<usize>, data| NamedTensor { name, shape, data };
    let mut p = Prepared {
        // any plan: step3p7() reads the tensors only
        plan: Plan {
            family: crate::Family::Step3p7,
            processor_class: "test",
            width: 2,
            height: 2,
            target: (2, 2),
            geometry: crate::plan::Geometry::Gemma4 {
                gh: 1,
                gw: 1,
                pool: 1,
            },
            rows: 0,
            prompt_runs: Vec::new(),
        },
        tensors: vec![
            tensor(
                "pixel_values",
                vec![1, 3, 2, 2],
                TensorData::F32(vec![0.0; 12]),
            ),
            tensor("num_local_patches", vec![1], TensorData::I64(vec![2])),
            tensor(
                "pixel_values_local",
                vec![2, 3, 2, 2],
                TensorData::F32(local.clone()),
            ),
            tensor("patch_newline_masks", vec![2], TensorData::U8(vec![0, 1])),
        ],
    };
    let s = p.step3p7().expect("a step3p7 view");
    let crops: Vec<&[f32]> = s.crops.iter().map(|c| c.pixels).collect();
    assert_eq!(crops, vec![&local[..12], &local[12..]]);
    assert_eq!(s.newline_mask, vec![false, true]);
    assert_eq!((s.global.height, s.crops[1].width), (2, 2));
    p.tensors[1] = tensor("num_local_patches", vec![1], TensorData::I64(vec![0]));
    assert_eq!(p.step3p7().expect("no crops").crops.len(), 0);
    p.tensors[1] = tensor("num_local_patches", vec![1], TensorData::I64(vec![-1]));
    assert!(p.step3p7().is_none(), "a negative crop count");
}
