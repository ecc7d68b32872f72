"""ragguard's tools, apart from the library: the `ragguard` command line (cli), `ragguard top` (top),
`ragguard doctor` (doctor), the policy reference generator (policy_doc), the demo and the bench.

They import ragguard; ragguard never imports them.
"""
