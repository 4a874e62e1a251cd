//! Bad job files are refused with the line and field named, and nothing is stored.

use crate::harness::*;

#[test]
fn bad_job_files_are_rejected_naming_line_and_field() {
    if !can_run("bad_job_files_are_rejected_naming_line_and_field") {
        return;
    }
    let c = Cluster::start();
    let alice = user("wharf-alice");
    let home = c.home(&alice);
    let cases = [
        (
            "mem.toml",
            "name = \"x\"\ncommand = [\"true\"]\nmemory = \"12XB\"\n",
            "line 3",
        ),
        (
            "field.toml",
            "command = [\"true\"]\ncpu = 2\n",
            "unknown field `cpu`",
        ),
        ("syntax.toml", "command = [\"true\"\n", "line 1"),
        (
            "both.toml",
            "command = [\"true\"]\nscript = \"true\"\n",
            "either `command` or `script`",
        ),
        (
            "image.toml",
            "command = [\"true\"]\nimage = \"No-Such-Image\"\n",
            "unknown image \"No-Such-Image\": no node has imported it, and it is not a registry reference (image reference \"No-Such-Image\": repository component \"No-Such-Image\" has uppercase letters",
        ),
        (
            "time.toml",
            "command = [\"true\"]\ntime = \"30d\"\n",
            "over the site's maximum",
        ),
        (
            "bad.sh",
            "#!/bin/sh\n#WHARF --cpus=2\n#WHARF --gpus=many\necho hi\n",
            "bad.sh line 3: invalid count \"many\" in --gpus: a count is a whole number",
        ),
    ];
    for (name, text, expect) in cases {
        let path = home.join(name);
        std::fs::write(&path, text).unwrap();
        let out = c.wharf_as(&alice, &["submit", path.to_str().unwrap()]);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{name} accepted: {}",
            stdout(&out)
        );
        assert!(
            stderr(&out).contains(expect),
            "{name}: expected {expect:?} in {:?}",
            stderr(&out)
        );
    }
    let all = c.wharf(&["queue", "--all", "--json"]);
    let list: serde_json::Value = serde_json::from_slice(&all.stdout).unwrap();
    assert_eq!(
        list["jobs"].as_array().unwrap().len(),
        0,
        "something was stored: {list}"
    );
    // And a good one is accepted.
    let good = home.join("good.toml");
    std::fs::write(&good, "command = [\"true\"]\nmemory = \"64M\"\n").unwrap();
    let id = submitted_id(&c.wharf_as(&alice, &["submit", good.to_str().unwrap()]));
    assert_eq!(
        c.wait_done(id, std::time::Duration::from_secs(30))["state"],
        "COMPLETED"
    );
}

#[test]
fn an_sbatch_script_runs_under_its_interpreter_with_its_arguments_and_file_letters() {
    if !can_run("an_sbatch_script_runs_under_its_interpreter_with_its_arguments_and_file_letters") {
        return;
    }
    let c = Cluster::start();
    let u = user("wharf-sbatch");
    let home = c.home(&u);
    // bash's own syntax, sbatch options Wharf does not honour, and sbatch's file letters.
    let script = home.join("b.sh");
    std::fs::write(
        &script,
        "#!/bin/bash\n#SBATCH --mem 32M --mail-type=END -o 'o_%u_%N_%%_%n_%t_%s_%a_%5j.out'\n\
         a=(\"$@\"); [[ ${#a[@]} == 2 ]] && echo \"bash ${a[1]} ${a[0]}\"\n",
    )
    .unwrap();
    let out = c.wharf_as(&u, &["submit", script.to_str().unwrap(), "one two", "-x"]);
    assert!(
        stderr(&out).contains("--mail-type (Wharf sends no mail)"),
        "{}",
        stderr(&out)
    );
    let id = submitted_id(&out);
    let done = c.wait_done(id, std::time::Duration::from_secs(30));
    assert_eq!(done["state"], "COMPLETED", "{done}");
    let node = nodes_of(&done)[0].split('.').next().unwrap().to_string();
    let name = format!("o_{}_{node}_%_0_0_batch_4294967294_{id:05}.out", u.name);
    let text = std::fs::read_to_string(home.join(&name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(text, "bash -x one two\n");
    // `wharf show` names the script's interpreter and its arguments.
    let show = stdout(&c.wharf_as(&u, &["show", &id.to_string()]));
    assert!(
        show.contains("(script, 3 lines, /bin/bash, arguments: 'one two' -x)"),
        "{show}"
    );

    // A Python script, where the node has Python (CI's always does).
    let python = std::path::Path::new("/usr/bin/python3").exists();
    if !python {
        let why = "the Python script part needs /usr/bin/python3";
        assert!(
            std::env::var("WHARF_TEST_STRICT").as_deref() != Ok("1"),
            "{why}"
        );
        eprintln!("SKIPPED {why}");
    }
    if python {
        let py = home.join("p.py");
        std::fs::write(
            &py,
            "#!/usr/bin/python3 -u\n#SBATCH --mem 64M -o py-%j.out\nimport sys\nprint('py', sys.argv[1:])\n",
        )
        .unwrap();
        let id =
            submitted_id(&c.wharf_as(&u, &["submit", "--parsable", py.to_str().unwrap(), "a"]));
        let done = c.wait_done(id, std::time::Duration::from_secs(30));
        assert_eq!(done["state"], "COMPLETED", "{done}");
        let text = std::fs::read_to_string(home.join(format!("py-{id}.out"))).unwrap();
        assert_eq!(text, "py ['a']\n");
    }
}
