//! Meshes, partition specs and named shardings against answers worked out by hand from JAX's
//! definitions (`np.arange(n).reshape(sizes)` device layout, `devices_indices_map`,
//! `axis_index_groups`), and their error messages.
use shardlab::sharding::{Mesh, NamedSharding, PartitionSpec, ShardingError};

fn mesh(text: &str) -> Mesh {
    Mesh::parse(text).unwrap()
}

fn p(text: &str) -> PartitionSpec {
    PartitionSpec::parse(text).unwrap()
}

fn sharding(mesh_text: &str, spec: &str) -> NamedSharding {
    NamedSharding::new(mesh(mesh_text), p(spec)).unwrap()
}

#[track_caller]
fn assert_err_contains<T: std::fmt::Debug>(result: Result<T, ShardingError>, wanted: &[&str]) {
    let message = result.expect_err("expected an error").to_string();
    for w in wanted {
        assert!(message.contains(w), "error `{message}` does not contain `{w}`");
    }
}

// ---- Mesh ----

#[test]
fn mesh_parse_and_new_agree_and_print_as_jax() {
    let m = mesh("dp=4,tp=2");
    assert_eq!(m, Mesh::new(&[("dp", 4), ("tp", 2)]).unwrap());
    assert_eq!(m, mesh(" dp = 4 , tp=2 "));
    assert_eq!(m.devices(), 8);
    assert_eq!(m.shape(), vec![4, 2]);
    assert_eq!(m.axis_names(), vec!["dp", "tp"]);
    assert_eq!(m.axis_size("tp").unwrap(), 2);
    assert_eq!(m.to_string(), "Mesh('dp': 4, 'tp': 2)");
    assert_eq!(mesh("x=3").devices(), 3);
    assert_eq!(Mesh::new(&[]).unwrap().devices(), 1);
}

#[test]
fn mesh_numbers_devices_row_major_like_numpy_arange_reshape() {
    // np.arange(8).reshape(4, 2): device 5 sits at [2, 1].
    let m = mesh("dp=4,tp=2");
    assert_eq!(m.device_coords(5).unwrap(), vec![2, 1]);
    assert_eq!(m.device_at(&[2, 1]).unwrap(), 5);
    assert_eq!(m.axis_index(5, "dp").unwrap(), 2);
    assert_eq!(m.axis_index(5, "tp").unwrap(), 1);
    // axis_index(('dp', 'tp')) = dp * 2 + tp; axis_index(('tp', 'dp')) = tp * 4 + dp.
    assert_eq!(m.axes_index(5, &["dp", "tp"]).unwrap(), 5);
    assert_eq!(m.axes_index(5, &["tp", "dp"]).unwrap(), 6);
    // np.arange(12).reshape(2, 3, 2): device 9 sits at [1, 1, 1].
    let m3 = mesh("a=2,b=3,c=2");
    assert_eq!(m3.device_coords(9).unwrap(), vec![1, 1, 1]);
    assert_eq!(m3.device_coords(4).unwrap(), vec![0, 2, 0]);
}

#[test]
fn mesh_axis_groups_are_jax_replica_groups_on_2x4_mesh() {
    let m = mesh("dp=2,tp=4");
    assert_eq!(
        m.axis_groups(&["tp"]).unwrap(),
        vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]]
    );
    assert_eq!(
        m.axis_groups(&["dp"]).unwrap(),
        vec![vec![0, 4], vec![1, 5], vec![2, 6], vec![3, 7]]
    );
    assert_eq!(m.axis_groups(&["dp", "tp"]).unwrap(), vec![(0..8).collect::<Vec<_>>()]);
    // A tuple in non-mesh order: members ordered by axis_index(('tp', 'dp')) = tp * 2 + dp.
    assert_eq!(
        m.axis_groups(&["tp", "dp"]).unwrap(),
        vec![vec![0, 4, 1, 5, 2, 6, 3, 7]]
    );
    // No axes: every device alone.
    assert_eq!(m.axis_groups(&[]).unwrap(), (0..8).map(|d| vec![d]).collect::<Vec<_>>());
}

#[test]
fn every_devices_index_along_axes_is_its_axes_index_in_any_axis_order() {
    let m = mesh("a=2,b=3,c=2");
    for axes in [
        vec![],
        vec!["b"],
        vec!["c", "a"],
        vec!["a", "b", "c"],
        vec!["c", "b", "a"],
    ] {
        let each: Vec<usize> = (0..m.devices()).map(|d| m.axes_index(d, &axes).unwrap()).collect();
        assert_eq!(m.axes_indices(&axes).unwrap(), each, "{axes:?}");
    }
    assert!(m.axes_indices(&["d"]).is_err(), "an axis the mesh lacks");
}

#[test]
fn mesh_axis_groups_on_3d_mesh_with_odd_axis() {
    let m = mesh("a=2,b=3,c=2");
    assert_eq!(
        m.axis_groups(&["b"]).unwrap(),
        vec![vec![0, 2, 4], vec![1, 3, 5], vec![6, 8, 10], vec![7, 9, 11]]
    );
    assert_eq!(
        m.axis_groups(&["a", "c"]).unwrap(),
        vec![vec![0, 1, 6, 7], vec![2, 3, 8, 9], vec![4, 5, 10, 11]]
    );
    assert_eq!(m.axes_size(&["a", "c"]).unwrap(), 4);
}

#[test]
fn mesh_parse_errors_name_the_problem() {
    assert_err_contains(Mesh::parse("dp4"), &["`dp4` is not of the form NAME=SIZE", "dp=4,tp=2"]);
    assert_err_contains(Mesh::parse("dp=0"), &["mesh axis 'dp' has size 0"]);
    assert_err_contains(Mesh::parse("dp=2,dp=2"), &["mesh axis 'dp' is given twice"]);
    assert_err_contains(Mesh::parse("dp=x"), &["size `x` of axis 'dp' is not a whole number"]);
    assert_err_contains(Mesh::parse("dp=-1"), &["not a whole number"]);
    assert_err_contains(Mesh::parse(""), &["empty"]);
    assert_err_contains(Mesh::parse("=4"), &["no axis name"]);
    assert_err_contains(Mesh::parse("dp=2,"), &["is not of the form NAME=SIZE"]);
    assert_err_contains(Mesh::parse("1dp=2"), &["`1dp` is not valid"]);
    assert_err_contains(Mesh::new(&[("tp", 0)]), &["mesh axis 'tp' has size 0"]);
}

#[test]
fn mesh_lookups_reject_unknown_axes_repeated_axes_and_devices_off_the_mesh() {
    let m = mesh("dp=2,tp=4");
    assert_err_contains(
        m.axis_groups(&["xx"]),
        &["unknown mesh axis 'xx'", "Mesh('dp': 2, 'tp': 4)", "('dp', 'tp')"],
    );
    assert_err_contains(
        m.axis_groups(&["dp", "dp"]),
        &["mesh axis 'dp' is used twice in the axes ('dp', 'dp')"],
    );
    assert_err_contains(m.axis_index(0, "pp"), &["unknown mesh axis 'pp'"]);
    assert_err_contains(m.device_coords(8), &["device 8 is out of range", "8 devices"]);
    assert_err_contains(m.device_at(&[2, 0]), &["do not lie on the mesh"]);
}

// ---- PartitionSpec ----

#[test]
fn partition_spec_parses_python_syntax_with_either_quote() {
    let want = PartitionSpec::from_axes(&[Some("dp"), None]);
    assert_eq!(p("P(\"dp\", None)"), want);
    assert_eq!(p("P('dp',None)"), want);
    assert_eq!(p("  P( 'dp' , None , )  "), want);
    assert_eq!(p("PartitionSpec('dp', None)"), want);
    assert_eq!(p("P()"), PartitionSpec::replicated());
    assert_eq!(p("P(('dp','tp'))"), PartitionSpec::from_tuples(&[&["dp", "tp"]]));
    assert_eq!(
        p("P(None, (\"dp\", 'tp'), 'pp')"),
        PartitionSpec::from_tuples(&[&[], &["dp", "tp"], &["pp"]])
    );
    // Canonical as in JAX: a 1-tuple is its axis, an empty tuple is None.
    assert_eq!(p("P(('dp',), ())"), p("P('dp', None)"));
}

#[test]
fn partition_spec_prints_as_jax_repr() {
    assert_eq!(p("P(\"dp\", None)").to_string(), "PartitionSpec('dp', None)");
    assert_eq!(p("P('dp')").to_string(), "PartitionSpec('dp',)");
    assert_eq!(p("P(('dp', 'tp'))").to_string(), "PartitionSpec(('dp', 'tp'),)");
    assert_eq!(
        p("P(None, ('dp', 'tp'))").to_string(),
        "PartitionSpec(None, ('dp', 'tp'))"
    );
    assert_eq!(p("P()").to_string(), "PartitionSpec()");
    for text in ["P('dp', None)", "P(('dp', 'tp'),)", "P()", "P(None, 'tp')"] {
        let spec = p(text);
        assert_eq!(p(&spec.to_string()), spec, "{text} does not round-trip through Display");
    }
}

#[test]
fn partition_spec_parse_errors_say_what_to_write() {
    let err = |t: &str| PartitionSpec::parse(t);
    assert_err_contains(err("P(dp)"), &["`dp` is not quoted", "'dp'"]);
    // One hint, not the reason's and then the general one again.
    let text = err("P(dp)").unwrap_err().to_string();
    assert_eq!(text.matches("write").count(), 1, "{text}");
    assert_err_contains(err("Q('dp')"), &["must start with `P(`"]);
    assert_err_contains(err("P('dp'"), &["expected `,` or `)`"]);
    assert_err_contains(err("P('dp') x"), &["after the closing `)`"]);
    assert_err_contains(err("P('d p')"), &["'d p' is not a valid mesh axis name"]);
    assert_err_contains(err("P('dp',,)"), &["expected None, a quoted axis name or a tuple"]);
    assert_err_contains(err("P('dp)"), &["never closed"]);
    assert_err_contains(err("P(('dp', None))"), &["expected a quoted axis name"]);
    assert_err_contains(err("'dp'"), &["P('dp', None)"]);
}

// ---- NamedSharding ----

#[test]
fn shard_shape_divides_each_dimension_by_its_axes() {
    assert_eq!(
        sharding("dp=4", "P('dp', None)").shard_shape(&[8, 3]).unwrap(),
        vec![2, 3]
    );
    assert_eq!(
        sharding("dp=4,tp=2", "P('dp', 'tp')").shard_shape(&[8, 6]).unwrap(),
        vec![2, 3]
    );
    assert_eq!(
        sharding("dp=4,tp=2", "P(('dp', 'tp'))").shard_shape(&[16, 5]).unwrap(),
        vec![2, 5]
    );
    assert_eq!(sharding("dp=4,tp=2", "P()").shard_shape(&[6, 5]).unwrap(), vec![6, 5]);
    assert_eq!(sharding("x=3", "P('x')").shard_shape(&[6]).unwrap(), vec![2]);
    assert_eq!(
        sharding("dp=3,tp=2", "P(('dp', 'tp'), None)")
            .shard_shape(&[6, 5])
            .unwrap(),
        vec![1, 5]
    );
    assert_eq!(sharding("dp=3", "P()").shard_shape(&[]).unwrap(), Vec::<usize>::new());
}

#[test]
fn device_indices_match_jax_devices_indices_map_on_1d_mesh() {
    let s = sharding("dp=4", "P('dp', None)");
    let want = [[0..2, 0..3], [2..4, 0..3], [4..6, 0..3], [6..8, 0..3]];
    for (d, w) in want.iter().enumerate() {
        assert_eq!(s.device_indices(d, &[8, 3]).unwrap(), w.to_vec(), "device {d}");
    }
    // Odd mesh size: 'x'=3 over a dimension of 6.
    let s = sharding("x=3", "P(None, 'x')");
    assert_eq!(s.device_indices(2, &[1, 6]).unwrap(), vec![0..1, 4..6]);
}

#[test]
fn device_indices_match_jax_devices_indices_map_on_2d_mesh() {
    // dp=4, tp=2; device 5 is (dp=2, tp=1).
    let m = "dp=4,tp=2";
    assert_eq!(
        sharding(m, "P('dp', 'tp')").device_indices(5, &[8, 6]).unwrap(),
        vec![4..6, 3..6]
    );
    assert_eq!(
        sharding(m, "P('tp', 'dp')").device_indices(5, &[6, 8]).unwrap(),
        vec![3..6, 4..6]
    );
    // Replicated along dp: every dp coordinate with tp=0 holds columns 0..3.
    let s = sharding(m, "P(None, 'tp')");
    for d in [0, 2, 4, 6] {
        assert_eq!(s.device_indices(d, &[3, 6]).unwrap(), vec![0..3, 0..3], "device {d}");
    }
    assert_eq!(s.device_indices(7, &[3, 6]).unwrap(), vec![0..3, 3..6]);
    // Fully replicated.
    assert_eq!(sharding(m, "P()").device_indices(3, &[3, 6]).unwrap(), vec![0..3, 0..6]);
}

#[test]
fn device_indices_of_tuple_axes_put_the_first_axis_major() {
    let m = "dp=4,tp=2";
    // ('dp', 'tp'): device 5 (dp=2, tp=1) holds chunk 2*2+1 = 5 of 8.
    let s = sharding(m, "P(('dp', 'tp'))");
    assert_eq!(s.device_indices(5, &[16]).unwrap(), vec![10..12]);
    // ('tp', 'dp'): chunk 1*4+2 = 6.
    let s = sharding(m, "P(('tp', 'dp'))");
    assert_eq!(s.device_indices(5, &[16]).unwrap(), vec![12..14]);
    // Odd sizes: dp=3, tp=2 over 6 rows; device 4 is (dp=2, tp=0): chunk 4.
    let s = sharding("dp=3,tp=2", "P(('dp', 'tp'), None)");
    assert_eq!(s.device_indices(4, &[6, 5]).unwrap(), vec![4..5, 0..5]);
}

#[test]
fn is_replicated_along_is_true_for_axes_the_spec_does_not_name() {
    let s = sharding("dp=4,tp=2", "P('dp', None)");
    assert!(!s.is_replicated_along("dp"));
    assert!(s.is_replicated_along("tp"));
    let s = sharding("dp=4,tp=2", "P(('dp', 'tp'))");
    assert!(!s.is_replicated_along("tp"));
    assert!(sharding("dp=4,tp=2", "P()").is_replicated_along("dp"));
}

#[test]
fn shard_shape_errors_name_dimension_size_and_axis() {
    assert_err_contains(
        sharding("dp=4", "P('dp')").shard_shape(&[6]),
        &["dimension 0 of size 6 is not divisible by mesh axis 'dp' of size 4"],
    );
    assert_err_contains(
        sharding("dp=4,tp=2", "P(None, ('dp', 'tp'))").shard_shape(&[2, 6]),
        &["dimension 1 of size 6 is not divisible by mesh axes ('dp', 'tp') of size 8"],
    );
    assert_err_contains(
        sharding("x=3", "P(None, 'x')").shard_shape(&[3, 4]),
        &["dimension 1 of size 4 is not divisible by mesh axis 'x' of size 3"],
    );
    assert_err_contains(
        sharding("dp=4", "P('dp', None)").shard_shape(&[8]),
        &["PartitionSpec('dp', None) has 2 entries but the array of shape [8] has rank 1"],
    );
    assert_err_contains(
        sharding("dp=4", "P('dp')").device_indices(0, &[6]),
        &["dimension 0 of size 6"],
    );
}

#[test]
fn named_sharding_rejects_unknown_and_repeated_axes() {
    assert_err_contains(
        NamedSharding::new(mesh("dp=4"), p("P('xx')")),
        &["unknown mesh axis 'xx'", "Mesh('dp': 4)"],
    );
    assert_err_contains(
        NamedSharding::new(mesh("dp=4,tp=2"), p("P('dp', ('tp', 'dp'))")),
        &["mesh axis 'dp' is used twice in PartitionSpec('dp', ('tp', 'dp'))"],
    );
    // Built field by field, the checks run when it is used.
    let s = NamedSharding {
        mesh: mesh("dp=2"),
        spec: p("P('dp', 'dp')"),
    };
    assert_err_contains(s.shard_shape(&[2, 2]), &["used twice"]);
}

#[test]
fn shard_lays_out_device_blocks_and_unshard_inverts_it() {
    let s = sharding("dp=4,tp=2", "P('dp', 'tp')");
    let global: Vec<f32> = (0..48).map(|v| v as f32).collect(); // (8, 6)
    let sharded = s.shard(&global, &[8, 6]).unwrap();
    assert_eq!(sharded.len(), 48);
    // Device 5 (dp=2, tp=1): rows 4..6, columns 3..6.
    assert_eq!(&sharded[5 * 6..6 * 6], &[27.0, 28.0, 29.0, 33.0, 34.0, 35.0]);
    assert_eq!(s.unshard(&sharded, &[8, 6]).unwrap(), global);
    // Replicated along dp: the layout holds the block on each of the 4 dp coordinates.
    let r = sharding("dp=4,tp=2", "P(None, 'tp')");
    let sharded = r.shard(&global, &[8, 6]).unwrap();
    assert_eq!(sharded.len(), 8 * 24);
    assert_eq!(&sharded[0..24], &sharded[2 * 24..3 * 24]);
    assert_eq!(r.unshard(&sharded, &[8, 6]).unwrap(), global);
    assert_err_contains(
        s.shard(&global[..47], &[8, 6]),
        &["holds 47 elements but 48 are needed"],
    );
}
