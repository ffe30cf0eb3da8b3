import csv, gzip, sys, collections
rows=list(csv.reader(gzip.open(sys.argv[1],'rt'))); hdr=rows[1]; data=[r for r in rows[2:] if len(r)>=len(hdr)]
ix={h:i for i,h in enumerate(hdr)}
src=[r[ix['Source']].strip() for r in data]; addr=[int(r[ix['Address']],16)&0xfffff for r in data]
S=[int(r[ix['Warp Stall Sampling (All Samples)']] or 0) for r in data]
lo=[addr[i] for i,s in enumerate(src) if 'USETMAXREG.DEALLOC.CTAPOOL 0x18' in s][0]
hi=[addr[i] for i,s in enumerate(src) if 'USETMAXREG.TRY_ALLOC' in s][-1]
cat=collections.Counter()
for i in range(len(data)):
    s=src[i]; prev=src[i-1] if i else ''
    if lo<=addr[i]<hi: c='producer'
    elif 'WARPGROUP.DEPBAR' in s: c='wgmma wait'
    elif 'DEPBAR.LE SB0' in prev: c='dQ reduce read wait'
    elif 'LDL' in s or 'STL' in s: c='local memory instr'
    elif 'R2UR' in s and S[i] and 'long_sb': c='R2UR (descriptor)'
    else: c='other'
    cat[c]+=S[i]
cons=sum(v for k,v in cat.items() if k!='producer')
print(sys.argv[1].split('/')[-3], 'consumer samples', cons)
for k,v in cat.most_common():
    if k!='producer': print(f'   {k:22s} {100*v/cons:5.1f}%')
